// C++ errors -> Python: Error -> RingcommError (a RuntimeError), TimeoutError
// -> ringcomm.TimeoutError (a RingcommError), ValueError / TypeError -> the
// builtins.
#include <pybind11/pybind11.h>

#ifdef __GLIBCXX__
#include <cxxabi.h>
#endif

#include "bindings/bind.h"
#include "bindings/buffers.h"
#include "comm/work.h"
#include "ringcomm/text.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

PyObject* base_error = nullptr;
PyObject* timeout_error = nullptr;
PyObject* mismatch_error = nullptr;
PyObject* revoked_error = nullptr;
PyObject* device_buffer_error = nullptr;

}  // namespace

void bind_errors(py::module_& m) {
  // pybind11 tries translators newest first: register the base class first.
  static py::exception<Error> base(m, "RingcommError", PyExc_RuntimeError);
  static py::exception<TimeoutError> timeout(m, "TimeoutError", base.ptr());
  static py::exception<MismatchError> mismatch(m, "CollectiveMismatchError", base.ptr());
  static py::exception<RevokedError> revoked(m, "RevokedError", base.ptr());
  static py::exception<DeviceBufferError> device(m, "DeviceBufferError", PyExc_ValueError);
  base_error = base.ptr();
  timeout_error = timeout.ptr();
  mismatch_error = mismatch.ptr();
  revoked_error = revoked.ptr();
  device_buffer_error = device.ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TimeoutError& e) {
      py::set_error(timeout, readable_text(e.what(), false).c_str());
    } catch (const MismatchError& e) {
      py::set_error(mismatch, readable_text(e.what(), false).c_str());
    } catch (const RevokedError& e) {
      py::set_error(revoked, readable_text(e.what(), false).c_str());
    } catch (const Interrupted& e) {
      // The KeyboardInterrupt raised by the signal handler is pending: keep it.
      if (!PyErr_Occurred()) py::set_error(base, readable_text(e.what(), false).c_str());
    } catch (const Error& e) {
      py::set_error(base, readable_text(e.what(), false).c_str());
    } catch (const DeviceBufferError& e) {
      py::set_error(device, readable_text(e.what(), false).c_str());
    } catch (const TypeError& e) {
      py::set_error(PyExc_TypeError, readable_text(e.what(), false).c_str());
    } catch (const ValueError& e) {
      py::set_error(PyExc_ValueError, readable_text(e.what(), false).c_str());
    }
  });
}

PyObject* error_class(Work::ErrorKind kind) {
  switch (kind) {
    case Work::ErrorKind::kTimeout: return timeout_error;
    case Work::ErrorKind::kMismatch: return mismatch_error;
    case Work::ErrorKind::kRevoked: return revoked_error;
    default: return base_error;
  }
}

PyObject* raise_current_exception() {
  try {
    throw;
#ifdef __GLIBCXX__
  } catch (abi::__forced_unwind&) {
    throw;  // a daemon thread ended at interpreter exit (calls.h: without_gil)
#endif
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const TimeoutError& e) {
    PyErr_SetString(timeout_error, readable_text(e.what(), false).c_str());
  } catch (const MismatchError& e) {
    PyErr_SetString(mismatch_error, readable_text(e.what(), false).c_str());
  } catch (const RevokedError& e) {
    PyErr_SetString(revoked_error, readable_text(e.what(), false).c_str());
  } catch (const Interrupted& e) {
    if (!PyErr_Occurred()) PyErr_SetString(base_error, readable_text(e.what(), false).c_str());
  } catch (const Error& e) {
    PyErr_SetString(base_error, readable_text(e.what(), false).c_str());
  } catch (const DeviceBufferError& e) {
    PyErr_SetString(device_buffer_error, readable_text(e.what(), false).c_str());
  } catch (const TypeError& e) {
    PyErr_SetString(PyExc_TypeError, readable_text(e.what(), false).c_str());
  } catch (const ValueError& e) {
    PyErr_SetString(PyExc_ValueError, readable_text(e.what(), false).c_str());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, readable_text(e.what(), false).c_str());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "ringcomm: unknown C++ exception");
  }
  return nullptr;
}

}  // namespace ringcomm
