// Helpers shared by the bindings of communicator calls.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "comm/work.h"
#include "ringcomm/types.h"

namespace ringcomm {

// Asynchronous calls keep their buffers alive through the Work (the Python
// layer also holds in-flight Works until they complete). None after a
// synchronous call.
inline pybind11::object finish(std::shared_ptr<Work> work, pybind11::tuple keep) {
  if (!work) return pybind11::none();
  pybind11::object w = pybind11::cast(std::move(work));
  w.attr("_buffers") = std::move(keep);
  return w;
}

inline ReduceOp to_op(long op) {
  if (op < 0 || op >= kNumReduceOps) throw ValueError("op " + std::to_string(op) + " is not a ReduceOp");
  return static_cast<ReduceOp>(op);
}

}  // namespace ringcomm
