// Helpers shared by the bindings of communicator calls.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

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

// Runs f() with the GIL released and returns what it returns; f's waits
// look at Ctrl-C (executor.h: interrupt_check) when this is the thread that
// runs Python's signal handlers (another thread taking the GIL every 20 ms
// while it waits would only slow the main thread down).
//
// Every binding that lets go of the GIL goes through here, never through a
// guard object: taking the GIL back in a daemon thread once the interpreter
// is finalizing ends that thread (CPython unwinds it with pthread_exit), and
// that unwinding aborts the process ("terminate called without an active
// exception") if it starts in a destructor (noexcept) or while another
// exception unwinds. So f's exception is caught first, the GIL is taken back
// in plain code, and the exception is thrown again after; the unwinding of a
// thread ended there passes raise_current_exception (bind_errors.cpp) and
// pybind11's dispatcher, which both let it through.
template <class F>
auto without_gil(F&& f) {
  using R = decltype(f());
  constexpr bool kVoid = std::is_void_v<R>;
  const InterruptCheck prev = interrupt_check();
  if (PyThread_get_thread_ident() == signal_thread()) set_interrupt_check(&python_interrupted);
  PyThreadState* state = PyEval_SaveThread();
  std::exception_ptr error;
  std::optional<std::conditional_t<kVoid, char, R>> out;  // (char: nothing to keep)
  try {
    if constexpr (kVoid) {
      f();
    } else {
      out.emplace(f());
    }
  } catch (...) {
    error = std::current_exception();
  }
  set_interrupt_check(prev);
  PyEval_RestoreThread(state);
  if (error) std::rethrow_exception(error);
  if constexpr (!kVoid) return std::move(*out);
}

inline ReduceOp to_op(long op) {
  if (op < 0 || op >= kNumReduceOps) throw ValueError("op " + std::to_string(op) + " is not a ReduceOp");
  return static_cast<ReduceOp>(op);
}

}  // namespace ringcomm
