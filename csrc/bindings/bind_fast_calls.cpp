// Communicator.all_reduce, send and recv as plain CPython methods (METH_FASTCALL).
//
// A small all_reduce takes about a microsecond; pybind11's generic dispatch
// (an argument tuple, a function_call record, casters looked up by type)
// cost a fifth of it and its garbage-collected tuples woke Python's cycle
// collector. This wrapper reads its arguments straight from the vector
// Python passes, allocates nothing on the synchronous path, and translates
// errors exactly as pybind11 does (bind_errors.cpp).
//
// An async call only queues the call (Communicator::submit: a lock held for
// a moment, no wait), so it keeps the GIL: releasing and taking it back cost
// a tenth of a small async_op=True + wait().
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/bind.h"
#include "bindings/buffers.h"
#include "bindings/calls.h"
#include "comm/communicator.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

Communicator& self_of(PyObject* self) {
  // The descriptor already checked that self is a Communicator.
  return py::handle(self).cast<Communicator&>();
}

PyObject* all_reduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 3) throw TypeError("Communicator.all_reduce(tensor, op, async_op) takes 3 arguments");
    Communicator& c = self_of(self);
    Buffer b = buffer_from_python(args[0], "tensor", true);
    const long op = PyLong_AsLong(args[1]);
    if (op == -1 && PyErr_Occurred()) throw py::error_already_set();
    const int async = PyObject_IsTrue(args[2]);
    if (async < 0) throw py::error_already_set();
    if (async) return make_work(c.all_reduce(b, to_op(op), true), self, args[0]).release().ptr();
    without_gil([&] { c.all_reduce(b, to_op(op), false); });
    Py_RETURN_NONE;
  } catch (...) {
    return raise_current_exception();
  }
}

long long int_arg(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

int int32_arg(PyObject* o, const char* name) {
  const long long v = int_arg(o);
  if (v < INT32_MIN || v > INT32_MAX) throw ValueError(std::string(name) + " " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

// send/recv: the ping-pong's calls (a 4-byte message takes about a microsecond).
PyObject* send(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 4) throw TypeError("Communicator.send(tensor, dst, tag, async_op) takes 4 arguments");
    Communicator& c = self_of(self);
    Buffer b = buffer_from_python(args[0], "tensor", false);
    const int dst = int32_arg(args[1], "dst");
    const long long tag = int_arg(args[2]);
    const int async = PyObject_IsTrue(args[3]);
    if (async < 0) throw py::error_already_set();
    if (async) return make_work(c.send(b, dst, tag, true), self, args[0]).release().ptr();
    without_gil([&] { c.send(b, dst, tag, false); });
    Py_RETURN_NONE;
  } catch (...) {
    return raise_current_exception();
  }
}

// A synchronous recv returns the rank the message came from.
PyObject* recv(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 4) throw TypeError("Communicator.recv(tensor, src, tag, async_op) takes 4 arguments");
    Communicator& c = self_of(self);
    Buffer b = buffer_from_python(args[0], "tensor", true);
    const int src = int32_arg(args[1], "src");
    const long long tag = int_arg(args[2]);
    const int async = PyObject_IsTrue(args[3]);
    if (async < 0) throw py::error_already_set();
    if (async) return make_work(c.recv(b, src, tag, true, nullptr), self, args[0]).release().ptr();
    int source = -1;
    without_gil([&] { c.recv(b, src, tag, false, &source); });
    return PyLong_FromLong(source);
  } catch (...) {
    return raise_current_exception();
  }
}

PyMethodDef methods[] = {
    {"all_reduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(all_reduce)), METH_FASTCALL,
     "all_reduce(tensor, op, async_op): reduces tensor in place on every rank; a Work when async_op"},
    {"send", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(send)), METH_FASTCALL,
     "send(tensor, dst, tag, async_op): sends tensor to dst; a Work when async_op"},
    {"recv", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(recv)), METH_FASTCALL,
     "recv(tensor, src, tag, async_op): receives the oldest message from src (ANY_SOURCE: any rank) with tag; "
     "the source rank, or a Work when async_op"},
};

}  // namespace

void bind_fast_calls(py::module_& m) {
  py::object cls = m.attr("Communicator");
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  for (PyMethodDef& def : methods) {
    py::object descr = py::reinterpret_steal<py::object>(PyDescr_NewMethod(type, &def));
    if (!descr) throw py::error_already_set();
    cls.attr(def.ml_name) = descr;
  }
}

}  // namespace ringcomm
