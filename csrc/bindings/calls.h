// Helpers shared by the bindings of communicator calls.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "comm/executor.h"
#include "comm/work.h"
#include "ringcomm/types.h"

namespace ringcomm {

// The Work of an asynchronous call (None after a synchronous one): a
// ringcomm.Work holding `comm` (the native communicator, as Python sees it)
// and the call's buffers `a`, `b` (null where unused) until the call
// completed (bind_work.cpp).
pybind11::object make_work(std::shared_ptr<Work> work, PyObject* comm, PyObject* a, PyObject* b = nullptr);

// Whether a signal handler raised (Ctrl-C -> KeyboardInterrupt) in this
// thread: takes the GIL for a moment. The exception stays pending and is what
// the bindings raise once the native call unwinds (as Interrupted).
inline bool python_interrupted() {
  pybind11::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;
}

// The thread that handles signals in Python (the main thread; set at import).
unsigned long& signal_thread();

// Releases the GIL for a blocking native call made from Python, and lets the
// call's waits look at Ctrl-C (executor.h: interrupt_check). Only the thread
// that runs Python's signal handlers asks: another thread taking the GIL
// every 20 ms while it waits would only slow the main thread down.
class ReleaseGil {
 public:
  ReleaseGil() : prev_(interrupt_check()) {
    if (PyThread_get_thread_ident() == signal_thread()) set_interrupt_check(&python_interrupted);
  }
  ~ReleaseGil() { set_interrupt_check(prev_); }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  InterruptCheck prev_;
  pybind11::gil_scoped_release release_;
};

inline ReduceOp to_op(long op) {
  if (op < 0 || op >= kNumReduceOps) throw ValueError("op " + std::to_string(op) + " is not a ReduceOp");
  return static_cast<ReduceOp>(op);
}

}  // namespace ringcomm
