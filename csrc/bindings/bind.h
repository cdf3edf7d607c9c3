#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "comm/algo_choice.h"
#include "comm/describe.h"
#include "comm/work.h"

namespace ringcomm {

struct PlanCacheStats;  // comm/plan_cache.h

// Names the bindings take (args.cpp). A collective by its name, ValueError
// listing the names otherwise (barrier only where `barrier_ok`).
OpKind collective_arg(const std::string& name, bool barrier_ok = true);
// The test hooks' (ringcomm._C_testing's) algo=: "auto", or a family op `kind` has a schedule of.
Algo algo_arg(const std::string& op, OpKind kind, const std::string& algo);

void bind_errors(pybind11::module_& m);
void bind_types(pybind11::module_& m);
void bind_communicator(pybind11::module_& m);
// ringcomm._C.Work, the handle of an async call (bind_work.cpp).
void bind_work(pybind11::module_& m);
// The chooser and the algorithm-name parser (bind_chooser.cpp); a GPU
// call's algo= as the GPU bindings take it.
void bind_chooser(pybind11::module_& m);
Algo parse_gpu_call_algo(const std::string& name);
// check_call and the same-dtype rule for the Python layers (bind_call_check.cpp).
void bind_call_check(pybind11::module_& m);
// Replaces pybind11's wrappers of the latency-critical methods with plain
// CPython ones (bind_fast_calls.cpp). After bind_communicator.
void bind_fast_calls(pybind11::module_& m);
// The cost model (explain, calibrate, the simulator's model). After bind_communicator.
void bind_cost_model(pybind11::module_& m);
// The plan cache's counters on Communicator (bind_plan_cache_stats.cpp). After bind_communicator.
void bind_plan_cache_stats(pybind11::module_& m);
// A communicator's (or the test hooks' checker's) plan cache counters as a dict.
pybind11::dict plan_cache_stats_dict(const PlanCacheStats& s);

#ifdef RINGCOMM_WITH_CUDA
void bind_cuda(pybind11::module_& m);  // bindings/cuda/bind_cuda.cpp
#endif

// Inside a catch block of a plain CPython function: sets the Python error
// pybind11 would have set for the exception in flight; returns nullptr.
PyObject* raise_current_exception();
// The ringcomm error class a failed Work's error kind is raised as (borrowed).
PyObject* error_class(Work::ErrorKind kind);

}  // namespace ringcomm
