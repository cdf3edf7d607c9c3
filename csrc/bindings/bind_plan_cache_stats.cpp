// The plan cache (comm/plan_cache.h) as users see it: a communicator's
// counters. The checker the tests drive is in ringcomm._C_testing
// (testing/bind_plan_cache.cpp).
#include <pybind11/pybind11.h>

#include "bindings/bind.h"
#include "comm/communicator.h"
#include "comm/plan_cache.h"

namespace py = pybind11;

namespace ringcomm {

py::dict plan_cache_stats_dict(const PlanCacheStats& s) {
  py::dict d;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["uncached"] = s.uncached;
  d["evictions"] = s.evictions;
  d["entries"] = s.entries;
  d["steps"] = s.steps;
  d["capacity"] = s.capacity;
  return d;
}

void bind_plan_cache_stats(py::module_& m) {
  auto comm = py::reinterpret_borrow<py::class_<Communicator>>(m.attr("Communicator"));
  comm.def("plan_cache_stats", [](const Communicator& c) { return plan_cache_stats_dict(c.plan_cache_stats()); });
}

}  // namespace ringcomm
