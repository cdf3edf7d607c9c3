// Test hook: the plan cache (comm/plan_cache.h) checker the tests drive
// (testing/plan_cache_check.h, not public API). A communicator's counters
// are bound in _C (bindings/bind_plan_cache_stats.cpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <tuple>

#include "bindings/bind.h"
#include "ringcomm/types.h"
#include "testing/plan_cache_check.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

// Changes step `i` of a plan the way `field` names (a difference the checker must report).
void tamper_with(Schedule& steps, size_t i, const std::string& field) {
  if (i >= steps.size()) {
    throw ValueError("plan cache check: tamper: no step " + std::to_string(i) + " (the plan has " +
                     std::to_string(steps.size()) + ")");
  }
  Step& s = steps[i];
  if (field == "dst") {
    s.dst += 1;  // one byte on, in the same buffer
  } else if (field == "src") {
    s.src += 1;
  } else if (field == "nbytes") {
    s.nbytes += 1;
  } else if (field == "after") {
    s.after = s.after == SIZE_MAX ? 0 : SIZE_MAX;
  } else {
    throw ValueError("plan cache check: tamper: field must be dst, src, nbytes or after, got '" + field + "'");
  }
}

}  // namespace

void bind_plan_cache(py::module_& m) {
  py::class_<PlanCacheChecker>(m, "PlanCacheChecker",
                               "Test hook: one rank's plan cache, each plan it hands out "
                               "compared with a fresh one (testing/plan_cache_check.h). Not public API.")
      .def(py::init([](int rank, int world, size_t capacity, size_t max_steps, std::optional<std::vector<int>> ring,
                       std::optional<std::vector<int>> hosts, size_t slice_elems) {
             return new PlanCacheChecker(rank, world, capacity, max_steps, ring ? *ring : std::vector<int>{},
                                         hosts ? *hosts : std::vector<int>{}, slice_elems);
           }),
           py::arg("rank"), py::arg("world"), py::arg("capacity") = PlanCache::kDefaultEntries,
           py::arg("max_steps") = PlanCache::kMaxSteps, py::arg("ring") = py::none(), py::arg("hosts") = py::none(),
           py::arg("slice_elems") = 16)
      .def(
          "plan",
          [](PlanCacheChecker& ch, const std::string& op, const std::string& algo, size_t count, size_t elem_size,
             int root, bool avg, bool has_out, bool has_in, bool in_place,
             std::optional<std::tuple<size_t, std::string>> tamper) {
            CacheCheckCall c;
            c.kind = collective_arg(op);
            c.algo = c.kind == OpKind::kBarrier ? Algo::kAuto : algo_arg(op, c.kind, algo);
            c.count = count;
            c.elem = elem_size;
            c.root = root;
            c.avg = avg;
            c.has_out = has_out;
            c.has_in = has_in;
            c.in_place = in_place;
            std::function<void(Schedule&)> hook;
            if (tamper) hook = [&](Schedule& s) { tamper_with(s, std::get<0>(*tamper), std::get<1>(*tamper)); };
            const CacheCheckResult r = ch.plan(c, hook);
            py::dict d;
            d["mismatch"] = r.mismatch;
            d["hit"] = r.hit;
            d["kept"] = r.kept;
            d["family"] = static_cast<int>(r.family);
            d["steps"] = r.steps;
            return d;
          },
          py::arg("op"), py::arg("algo") = "auto", py::arg("count") = 0, py::arg("elem_size") = 4, py::arg("root") = -1,
          py::arg("avg") = false, py::arg("has_out") = true, py::arg("has_in") = true, py::arg("in_place") = false,
          py::arg("tamper") = py::none(),
          "Plans one call through the cache and afresh: a dict with 'mismatch' (empty when they are equal, "
          "else the first step and field that differ), 'hit', 'kept', 'family' and 'steps'. has_out / has_in: "
          "which buffers the call has (a rooted call's absent side); in_place: the in-place form; "
          "tamper=(step, field) changes a copy of the cached plan first.")
      .def("stats", [](const PlanCacheChecker& ch) { return plan_cache_stats_dict(ch.stats()); })
      .def("clear", &PlanCacheChecker::clear);
}

}  // namespace ringcomm
