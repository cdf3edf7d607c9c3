// ringcomm._C: the private extension module. Each bind_*.cpp registers one
// concept; users import the public package `ringcomm`, never this module.
// The test hooks are in a module of their own (testing/module.cpp).
#include <pybind11/pybind11.h>

#include "bindings/bind.h"

namespace ringcomm {
unsigned long& signal_thread() {
  static unsigned long ident = 0;
  return ident;
}
}  // namespace ringcomm

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringcomm native core (private; use the ringcomm package)";
  ringcomm::signal_thread() =
      pybind11::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  ringcomm::bind_errors(m);
  ringcomm::bind_types(m);
  ringcomm::bind_communicator(m);
  ringcomm::bind_work(m);
  ringcomm::bind_call_check(m);
  ringcomm::bind_chooser(m);
  ringcomm::bind_fast_calls(m);
  ringcomm::bind_cost_model(m);
  ringcomm::bind_plan_cache_stats(m);
#ifdef RINGCOMM_WITH_CUDA
  ringcomm::bind_cuda(m);
#endif
}
