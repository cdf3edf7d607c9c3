// ringcomm.Work: the handle of an asynchronous CPU call, as a plain CPython
// type (re-exported by ringcomm/work.py).
//
// A 4-byte all_reduce takes about a microsecond. Through pybind11 (a holder
// cast per call, generic dispatch per method) and a Python wrapper that kept
// every in-flight Work in a list, async_op=True + wait() cost three times the
// blocking call. Here the call's binding builds the handle directly: one
// object, no tuple, no dict, not tracked by the cycle collector, and wait()
// without a timeout releases the GIL and waits (or runs the queued call
// itself, Work::wait) with no Python frame in between.
//
// Buffers stay alive until the call completed. A Work holds the call's
// buffers and the native communicator; one dropped while its call is still
// pending hands them to the orphan list, which lets go of them once the call
// completed (swept as new Works are made, and at close).
#include <pybind11/pybind11.h>

#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bindings/bind.h"
#include "bindings/calls.h"
#include "comm/work.h"
#include "ringcomm/text.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

constexpr int kKeep = 3;

struct PyWork {
  PyObject_HEAD
  std::shared_ptr<Work> work;
  PyObject* keep[kKeep];  // the call's buffers and the native communicator (null where unused)
};

// A pending call's references, kept after its Work was dropped. Touched with
// the GIL held only; never destroyed (references must not be released after
// the interpreter finalized).
struct Orphan {
  std::shared_ptr<Work> work;
  PyObject* keep[kKeep];
};
std::vector<Orphan>& orphans() {
  static auto* list = new std::vector<Orphan>();
  return *list;
}
size_t sweep_at = 64;  // a full sweep once the list has grown past this

void release(Orphan& o) {
  for (PyObject*& k : o.keep) Py_CLEAR(k);
  o.work.reset();
}

// Drops the orphans whose calls completed. Calls mostly complete in issue
// order: the cheap check looks at the oldest only, the full sweep runs when
// the list has grown.
//
// The references are released once the list is whole again: releasing a
// buffer may run Python code (a finalizer) that makes or drops Works.
void sweep(bool full) {
  auto& list = orphans();
  if (list.empty()) return;
  if (!full && list.size() < sweep_at && !list.front().work->is_completed()) return;
  std::vector<Orphan> done;
  size_t kept = 0;
  for (Orphan& o : list) {
    if (o.work->is_completed()) {
      done.push_back(std::move(o));
    } else {
      list[kept++] = std::move(o);
    }
  }
  list.resize(kept);
  sweep_at = std::max<size_t>(64, 2 * kept);
  for (Orphan& o : done) release(o);
}

PyObject* seconds_fn = nullptr;  // ringcomm.work.seconds, registered at its import

void work_dealloc(PyObject* self) {
  auto* p = reinterpret_cast<PyWork*>(self);
  if (p->work && !p->work->is_completed()) {
    Orphan o;
    o.work = std::move(p->work);
    for (int i = 0; i < kKeep; ++i) o.keep[i] = p->keep[i];  // the references move
    orphans().push_back(std::move(o));
  } else {
    for (PyObject*& k : p->keep) Py_CLEAR(k);
  }
  p->work.~shared_ptr<Work>();
  Py_TYPE(self)->tp_free(self);
}

Work& work_of(PyObject* self) {
  auto* p = reinterpret_cast<PyWork*>(self);
  if (!p->work) throw Error("ringcomm: this Work has no operation");
  return *p->work;
}

PyObject* text(const std::string& s) {
  const std::string t = readable_text(s, false);
  return PyUnicode_DecodeUTF8(t.data(), static_cast<Py_ssize_t>(t.size()), "replace");
}

// wait(timeout=None): seconds or a timedelta; 0 polls.
PyObject* work_wait(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  try {
    PyObject* timeout = Py_None;
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1) throw TypeError("Work.wait(timeout=None) takes at most 1 argument");
    if (nargs == 1) timeout = args[0];
    if (nkw == 1) {
      if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0) {
        throw TypeError("Work.wait() got an unexpected keyword argument");
      }
      timeout = args[0];
    }
    Work& w = work_of(self);
    if (timeout == Py_None) {
      without_gil([&] { w.wait(-1.0); });  // throws the call's error
      Py_RETURN_TRUE;
    }
    if (!seconds_fn) throw Error("ringcomm: Work.wait(timeout) before ringcomm.work was imported");
    py::object t = py::reinterpret_steal<py::object>(PyObject_CallOneArg(seconds_fn, timeout));
    if (!t) throw py::error_already_set();
    const double s = PyFloat_AsDouble(t.ptr());
    if (s == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    const bool done = without_gil([&] { return w.wait(s); });
    if (!done) {
      throw TimeoutError("ringcomm: wait for " + w.what() + " did not complete within " + py::repr(t).cast<std::string>() +
                         " s (the operation is still running)");
    }
    Py_RETURN_TRUE;
  } catch (...) {
    return raise_current_exception();
  }
}

PyObject* work_is_completed(PyObject* self, PyObject*) {
  try {
    return PyBool_FromLong(work_of(self).is_completed());
  } catch (...) {
    return raise_current_exception();
  }
}

// The error the call failed with (an instance of the class the blocking
// call would have raised), or None while pending and after success.
PyObject* work_exception(PyObject* self, PyObject*) {
  try {
    Work& w = work_of(self);
    if (!w.is_completed()) Py_RETURN_NONE;
    const std::string msg = w.error_message();
    if (msg.empty()) Py_RETURN_NONE;
    py::object m = py::reinterpret_steal<py::object>(text(msg));
    if (!m) throw py::error_already_set();
    return PyObject_CallOneArg(error_class(w.error_kind()), m.ptr());
  } catch (...) {
    return raise_current_exception();
  }
}

PyObject* work_source_rank(PyObject* self, PyObject*) {
  try {
    Work& w = work_of(self);
    return PyLong_FromLong(w.is_completed() ? w.source() : -1);
  } catch (...) {
    return raise_current_exception();
  }
}

PyObject* work_repr(PyObject* self) {
  auto* p = reinterpret_cast<PyWork*>(self);
  if (!p->work) return PyUnicode_FromString("<ringcomm.Work (none)>");
  const std::string s = "<ringcomm.Work " + readable_text(p->work->what(), true) + " " +
                        (p->work->is_completed() ? "completed" : "pending") + ">";
  return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
}

PyObject* work_what(PyObject* self, void*) {
  try {
    return text(work_of(self).what());
  } catch (...) {
    return raise_current_exception();
  }
}

PyMethodDef work_methods[] = {
    {"wait", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(work_wait)), METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None)\n--\n\n"
     "Blocks until the operation completed; raises its error if it failed.\n\n"
     "`timeout` (seconds or timedelta, 0 to poll, None for no limit) bounds this wait only: on expiry a\n"
     "ringcomm.TimeoutError is raised and the operation keeps running. Returns True."},
    {"is_completed", work_is_completed, METH_NOARGS,
     "is_completed()\n--\n\nTrue once the operation finished, successfully or not."},
    {"exception", work_exception, METH_NOARGS,
     "exception()\n--\n\nThe error the operation failed with (as the blocking call would have raised it), or None."},
    {"source_rank", work_source_rank, METH_NOARGS,
     "source_rank()\n--\n\nA recv's: the rank its message came from (-1 before it completed, and for other "
     "operations)."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef work_getset[] = {
    {"what", work_what, nullptr, "The operation's name.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject work_type = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "ringcomm.Work";
  t.tp_basicsize = sizeof(PyWork);
  t.tp_dealloc = work_dealloc;
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_repr = work_repr;
  t.tp_doc =
      "Returned by every call made with async_op=True.\n\n"
      "Operations on one communicator run in the order they were issued. The buffers passed to the call are "
      "kept alive until it completed (also when the Work is dropped first).";
  t.tp_methods = work_methods;
  t.tp_getset = work_getset;
  return t;
}();

}  // namespace

py::object make_work(std::shared_ptr<Work> work, PyObject* comm, PyObject* a, PyObject* b) {
  if (!work) return py::none();
  sweep(false);
  PyObject* o = work_type.tp_alloc(&work_type, 0);
  if (!o) throw py::error_already_set();
  auto* p = reinterpret_cast<PyWork*>(o);
  new (&p->work) std::shared_ptr<Work>(std::move(work));
  PyObject* keep[kKeep] = {a, b, comm};
  for (int i = 0; i < kKeep; ++i) {
    Py_XINCREF(keep[i]);
    p->keep[i] = keep[i];
  }
  return py::reinterpret_steal<py::object>(o);
}

void bind_work(py::module_& m) {
  if (PyType_Ready(&work_type) < 0) throw py::error_already_set();
  Py_INCREF(&work_type);
  m.attr("Work") = py::handle(reinterpret_cast<PyObject*>(&work_type));
  // ringcomm/work.py's seconds(): what wait(timeout) takes.
  m.def("_register_work_seconds", [](py::handle seconds) {
    Py_XDECREF(seconds_fn);
    seconds_fn = seconds.inc_ref().ptr();
  });
  m.def("_sweep_works", [] { sweep(true); return orphans().size(); },
        "Lets go of the buffers of dropped Works whose calls completed; returns how many are still pending.");
}

}  // namespace ringcomm
