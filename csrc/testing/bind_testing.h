// The test hooks' bindings (ringcomm._C_testing, testing/module.cpp). Not
// public API: the tests drive them, the package never imports them.
#pragma once

#include <pybind11/pybind11.h>

namespace ringcomm {

// The GPU ring family's translation run over a simulated NCCL (bind_device_sim.cpp).
void bind_device_sim(pybind11::module_& m);
// The cuda_ipc protocol over host shared memory (bind_ipc_sim.cpp).
void bind_ipc_sim(pybind11::module_& m);
// The plan checker (testing/plan_check.h).
void bind_plan_check(pybind11::module_& m);
// The plan cache checker (testing/plan_cache_check.h).
void bind_plan_cache(pybind11::module_& m);
// The autotuner's state machine with made-up times (bind_autotune.cpp).
void bind_autotune(pybind11::module_& m);
// The shared-memory slot store rule with made-up costs (bind_slot_stores.cpp).
void bind_slot_stores(pybind11::module_& m);

}  // namespace ringcomm
