// The cost model: a communicator's own (explain, calibrate, its parameters)
// and a free-standing one over any described topology (ringcomm-bench
// --simulate, tests).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "bindings/calls.h"
#include "comm/communicator.h"
#include "comm/cost_model.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

OpKind op_from_name(const std::string& name) {
  OpKind k;
  if (collective_from_name(name, &k)) return k;
  throw ValueError("unknown collective '" + name +
                   "' (all_reduce, reduce_scatter, all_gather, broadcast, reduce, scatter, gather, all_to_all, "
                   "barrier)");
}

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
  return d;
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
             return named(c.predict(op_from_name(op), nbytes));
           })
      .def("params", [](const CostModel& c) { return params_dict(c.params()); });

  auto comm = py::reinterpret_borrow<py::class_<Communicator>>(m.attr("Communicator"));
  comm.def("set_topology", &Communicator::set_topology, py::arg("host_labels"))
      .def("host_of", [](const Communicator& c) { return c.topology().host_of; })
      .def("measure_links", &Communicator::measure_links, py::arg("intra_peer"), py::arg("inter_peer"),
           py::arg("gamma_rank"), py::call_guard<ReleaseGil>())
      .def("set_cost_params", [](Communicator& c, const py::dict& d) { c.set_cost_params(params_from(d)); })
      .def("cost_params", [](const Communicator& c) { return params_dict(c.cost_model().params()); })
      .def("explain", [](const Communicator& c, const std::string& op, size_t nbytes) {
        return c.explain(op_from_name(op), nbytes);
      });
}

}  // namespace ringcomm
