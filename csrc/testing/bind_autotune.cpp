// Test hook: the tuner's state machine (comm/autotune.h) driven with made-up
// times, as one rank sees it (the agreement is the identity: one rank), so the
// tests can walk its transitions exactly: the band, the exploration, the
// backoff, load coming and going.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "bindings/bind.h"
#include "comm/autotune.h"
#include "comm/algo_choice.h"
#include "comm/describe.h"
#include "testing/bind_testing.h"

namespace py = pybind11;

namespace ringcomm {

void bind_autotune(py::module_& m) {
  py::class_<AutoTuner, std::unique_ptr<AutoTuner>>(m, "AutoTuner")
      .def(py::init([]() {
        auto t = std::make_unique<AutoTuner>();
        t->enable(true);
        return t;
      }))
      // One call of all_reduce of `nbytes` that took `seconds`; `candidates`:
      // (family name, predicted seconds), the model's pick first. Returns the
      // family the next call runs ("" for the model's pick).
      .def("call",
           [](AutoTuner& t, size_t nbytes, double seconds, const std::vector<std::pair<std::string, double>>& cands) {
             const OpKind kind = OpKind::kAllReduce;
             int64_t word = 0;
             if (!t.wants_time(kind, nbytes)) {
               const Algo a = t.override_for(kind, nbytes);
               return a == Algo::kAuto ? std::string() : std::string(algo_name(a));
             }
             const bool agree = t.record(kind, nbytes, seconds, &word, [&] {
               std::vector<Candidate> out;
               for (const auto& c : cands) {
                 Algo a;
                 if (!parse_algo_name(c.first, &a)) throw ValueError("no algorithm '" + c.first + "'");
                 out.push_back({a, c.second});
               }
               return out;
             });
             if (agree) t.agreed(kind, nbytes, word);
             const Algo a = t.override_for(kind, nbytes);
             return a == Algo::kAuto ? std::string() : std::string(algo_name(a));
           })
      .def("state", [](const AutoTuner& t, size_t nbytes) {
        AutoTuner::Report r;
        if (!t.report_of(OpKind::kAllReduce, nbytes, &r)) return std::string("none");
        return std::string(AutoTuner::state_name(r.state));
      })
      .def("explorations", [](const AutoTuner& t, size_t nbytes) {
        AutoTuner::Report r;
        return t.report_of(OpKind::kAllReduce, nbytes, &r) ? r.explorations : 0u;
      })
      .def_property_readonly_static("band", [](py::object) { return AutoTuner::kBand; })
      .def_property_readonly_static("first_check", [](py::object) { return AutoTuner::kFirstCheck; })
      .def_property_readonly_static("samples", [](py::object) { return AutoTuner::kSamples; })
      .def_property_readonly_static("check_seconds", [](py::object) { return AutoTuner::kCheckSeconds; })
      .def_property_readonly_static("max_backoff", [](py::object) { return AutoTuner::kMaxBackoff; });
}

}  // namespace ringcomm
