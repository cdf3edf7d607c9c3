// The cost model: a communicator's own (explain, calibrate, its parameters)
// and a free-standing one over any described topology (ringcomm-bench
// --simulate, tests).
#include <cmath>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "bindings/calls.h"
#include "comm/algo_choice.h"
#include "comm/communicator.h"
#include "comm/cost_model.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

py::dict link_dict(const LinkCost& l) {
  py::dict d;
  d["alpha"] = l.alpha;
  d["beta"] = l.beta;
  d["overhead"] = l.overhead;
  return d;
}

py::dict params_dict(const CostParams& p) {
  py::dict d;
  d["intra"] = link_dict(p.intra);
  d["inter"] = link_dict(p.inter);
  d["gamma"] = p.gamma;
  d["nics"] = p.nics;
  d["source"] = p.source;
  if (!p.fits.empty()) {
    py::dict fit;
    for (const FamilyFit& f : p.fits) {
      py::list pts;
      for (const auto& [bytes, ratio] : f.points) pts.append(py::make_tuple(bytes, ratio));
      fit[py::str(std::string(op_kind_name(f.kind)) + ":" + algo_name(f.algo))] = pts;
    }
    d["fit"] = fit;
    d["fit_for"] = py::make_tuple(p.fit_world, p.fit_hosts);
  }
  return d;
}

// "op:family" -> (op, family), checked as RINGCOMM_ALGO's per-op form is.
FamilyFit fit_of(const std::string& name, const py::handle& points) {
  AlgoChoice choice;
  try {
    choice = parse_algo_choice(name);
  } catch (const ValueError& e) {
    throw ValueError("cost model: fit '" + name + "': " + e.what());
  }
  FamilyFit f{OpKind::kAllReduce, Algo::kAuto, {}};
  int named = 0;
  for (int k = 0; k < kNumOpKinds; ++k) {
    if (choice.by_op[k] != Algo::kAuto) {
      f.kind = static_cast<OpKind>(k);
      f.algo = choice.by_op[k];
      ++named;
    }
  }
  if (named != 1 || name.find(':') == std::string::npos) {
    throw ValueError("cost model: a fit is named op:family (e.g. all_reduce:ring), got '" + name + "'");
  }
  for (auto pt : points.cast<py::list>()) {
    auto xy = pt.cast<std::pair<double, double>>();
    const bool ascending = f.points.empty() || xy.first > f.points.back().first;
    if (!(xy.first > 0 && xy.second > 0 && std::isfinite(xy.first) && std::isfinite(xy.second) && ascending)) {
      throw ValueError("cost model: fit " + name + " needs (bytes, ratio) points, both positive, bytes ascending");
    }
    f.points.push_back(xy);
  }
  return f;
}

LinkCost link_from(const py::dict& d) {
  return {d["alpha"].cast<double>(), d["beta"].cast<double>(), d["overhead"].cast<double>()};
}

CostParams params_from(const py::dict& d) {
  CostParams p;
  p.intra = link_from(d["intra"].cast<py::dict>());
  p.inter = link_from(d["inter"].cast<py::dict>());
  p.gamma = d["gamma"].cast<double>();
  if (d.contains("nics")) p.nics = d["nics"].cast<int>();  // optional: one network link per host
  if (p.nics < 1) throw ValueError("cost model: nics must be >= 1, got " + std::to_string(p.nics));
  p.source = d.contains("source") ? d["source"].cast<std::string>() : "given";
  if (d.contains("fit")) {
    for (auto item : d["fit"].cast<py::dict>()) {
      p.fits.push_back(fit_of(item.first.cast<std::string>(), item.second));
    }
    if (d.contains("fit_for")) {
      auto wh = d["fit_for"].cast<std::pair<int, int>>();
      p.fit_world = wh.first;
      p.fit_hosts = wh.second;
    }
  }
  return p;
}

std::vector<std::pair<std::string, double>> named(const std::vector<Prediction>& ps) {
  std::vector<std::pair<std::string, double>> out;
  for (const Prediction& p : ps) out.emplace_back(algo_name(p.algo), p.seconds);
  return out;
}

}  // namespace

void bind_cost_model(py::module_& m) {
  m.def("default_cost_params", [] { return params_dict(default_cost_params()); });
  py::class_<CostModel>(m, "CostModel")
      .def(py::init([](const std::vector<int>& host_labels, const py::dict& params, size_t slot_bytes,
                       size_t oneshot_max_bytes, bool check_agreement) {
             if (host_labels.empty()) throw ValueError("cost model: no ranks");
             ModelLimits lim;
             lim.slot_bytes = slot_bytes;
             lim.oneshot_max_bytes = oneshot_max_bytes;
             lim.check_agreement = check_agreement;
             return CostModel(Topology::from_hosts(host_labels), params_from(params), lim);
           }),
           py::arg("host_labels"), py::arg("params"), py::arg("slot_bytes") = 128 * 1024,
           py::arg("oneshot_max_bytes") = 64 * 1024, py::arg("check_agreement") = true)
      .def("predict", [](const CostModel& c, const std::string& op, size_t nbytes) {
             return named(c.predict(collective_arg(op), nbytes));
           })
      .def("params", [](const CostModel& c) { return params_dict(c.params()); });

  auto comm = py::reinterpret_borrow<py::class_<Communicator>>(m.attr("Communicator"));
  comm.def("set_topology", &Communicator::set_topology, py::arg("host_labels"))
      .def("host_of", [](const Communicator& c) { return c.topology().host_of; })
      .def("measure_links",
           [](Communicator& c, int intra_peer, int inter_peer, int gamma_rank) {
             return without_gil([&] { return c.measure_links(intra_peer, inter_peer, gamma_rank); });
           },
           py::arg("intra_peer"), py::arg("inter_peer"), py::arg("gamma_rank"))
      .def("set_cost_params", [](Communicator& c, const py::dict& d) { c.set_cost_params(params_from(d)); })
      .def("cost_params", [](const Communicator& c) { return params_dict(c.cost_model().params()); })
      .def("explain", [](const Communicator& c, const std::string& op, size_t nbytes) {
        return c.explain(collective_arg(op), nbytes);
      })
      .def("tuning", [](const Communicator& c) {
        py::list out;
        for (const AutoTuner::Report& r : c.tuning()) {
          py::dict d;
          d["op"] = op_kind_name(r.kind);
          d["nbytes"] = r.bytes;
          d["state"] = AutoTuner::state_name(r.state);
          d["runs"] = algo_name(r.pick);
          d["model_pick"] = algo_name(r.model_pick);
          d["predicted_s"] = r.predicted;
          d["kept_s"] = r.reference;
          d["explorations"] = r.explorations;
          py::list measured;
          for (const auto& m : r.measured) measured.append(py::make_tuple(algo_name(m.first), m.second));
          d["measured"] = measured;
          out.append(d);
        }
        return out;
      });
}

}  // namespace ringcomm
