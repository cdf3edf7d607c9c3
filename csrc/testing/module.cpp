// ringcomm._C_testing: the test hooks (the device simulation, the cuda_ipc
// protocol over host memory, the plan checker, the plan cache checker, the
// tuner's state machine and the slot store rule),
// kept out of the production module ringcomm._C. Built and installed beside
// it; only tests/ imports it (the package never does).
#include <pybind11/pybind11.h>

#include "testing/bind_testing.h"

PYBIND11_MODULE(_C_testing, m) {
  m.doc() = "ringcomm test hooks (private; not public API)";
  // _C first: it registers the exception types (bindings/bind_errors.cpp) that
  // errors raised here are translated to.
  pybind11::module_::import("ringcomm._C");
  ringcomm::bind_device_sim(m);
  ringcomm::bind_ipc_sim(m);
  ringcomm::bind_plan_check(m);
  ringcomm::bind_plan_cache(m);
  ringcomm::bind_autotune(m);
  ringcomm::bind_slot_stores(m);
}
