#include "bindings/buffers.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace ringcomm {
namespace {

[[noreturn]] void bad_dtype(const char* arg, const std::string& what) {
  throw TypeError(std::string(arg) + " has unsupported dtype " + what +
                  "; supported: float16, bfloat16, float32, float64, int8, uint8, int32, int64, bool");
}

DataType from_format(const char* arg, const char* fmt, Py_ssize_t itemsize) {
  std::string f = fmt ? fmt : "B";
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f = f.substr(1);
  if (!f.empty() && (f[0] == '>' || f[0] == '!')) bad_dtype(arg, "'" + f + "' (big-endian)");
  if (f.size() == 1) {
    switch (f[0]) {
      case 'e': return DataType::kFloat16;
      case 'f': return DataType::kFloat32;
      case 'd': return DataType::kFloat64;
      case 'b': return DataType::kInt8;
      case 'B': return DataType::kUInt8;
      case '?': return DataType::kBool;
      case 'i': case 'l': case 'q': case 'n':
        if (itemsize == 4) return DataType::kInt32;
        if (itemsize == 8) return DataType::kInt64;
        break;
      default: break;
    }
  }
  bad_dtype(arg, "'" + f + "' (" + std::to_string(itemsize) + " bytes)");
}

DataType from_typestr(const char* arg, const std::string& t) {
  // numpy typestr, e.g. "<f4", "|b1", "|u1", "<i8"
  if (t.size() < 3 || t[0] == '>') bad_dtype(arg, "'" + t + "'");
  char kind = t[1];
  int size = std::atoi(t.c_str() + 2);
  if (kind == 'f' && size == 2) return DataType::kFloat16;
  if (kind == 'f' && size == 4) return DataType::kFloat32;
  if (kind == 'f' && size == 8) return DataType::kFloat64;
  if (kind == 'i' && size == 1) return DataType::kInt8;
  if (kind == 'u' && size == 1) return DataType::kUInt8;
  if (kind == 'i' && size == 4) return DataType::kInt32;
  if (kind == 'i' && size == 8) return DataType::kInt64;
  if (kind == 'b' && size == 1) return DataType::kBool;
  bad_dtype(arg, "'" + t + "'");
}

DataType from_torch_dtype(const char* arg, py::handle dtype) {
  // torch dtypes are singletons: remember their mapping by identity (a few
  // pointers compared: cheaper than hashing, and there are 9 of them).
  static std::vector<std::pair<PyObject*, DataType>> seen;
  for (const auto& [p, t] : seen) {
    if (p == dtype.ptr()) return t;
  }
  std::string name = py::str(dtype);
  static const std::pair<const char*, DataType> names[] = {
      {"torch.float16", DataType::kFloat16}, {"torch.bfloat16", DataType::kBFloat16},
      {"torch.float32", DataType::kFloat32}, {"torch.float64", DataType::kFloat64},
      {"torch.int8", DataType::kInt8},       {"torch.uint8", DataType::kUInt8},
      {"torch.int32", DataType::kInt32},     {"torch.int64", DataType::kInt64},
      {"torch.bool", DataType::kBool}};
  for (auto& [n, t] : names) {
    if (name == n) {
      seen.emplace_back(dtype.inc_ref().ptr(), t);
      return t;
    }
  }
  bad_dtype(arg, name);
}

bool is_torch_tensor(py::handle obj) {
  static PyTypeObject* tensor_type = nullptr;
  PyTypeObject* t = Py_TYPE(obj.ptr());
  if (tensor_type) return PyType_IsSubtype(t, tensor_type);
  // Look the class up only once torch has been imported by somebody.
  PyObject* modules = PyImport_GetModuleDict();
  PyObject* torch = PyDict_GetItemString(modules, "torch");
  if (!torch) return false;
  py::object cls = py::reinterpret_borrow<py::object>(torch).attr("Tensor");
  tensor_type = reinterpret_cast<PyTypeObject*>(cls.inc_ref().ptr());
  return PyType_IsSubtype(t, tensor_type);
}

// Reads a torch tensor through its Python attributes (no libtorch linking).
// The attribute names are interned once: this runs on every call.
Buffer from_torch(py::handle obj, const char* arg) {
  static PyObject* is_cpu = PyUnicode_InternFromString("is_cpu");
  static PyObject* is_contiguous = PyUnicode_InternFromString("is_contiguous");
  static PyObject* dtype = PyUnicode_InternFromString("dtype");
  static PyObject* nbytes = PyUnicode_InternFromString("nbytes");
  static PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  auto get = [&](PyObject* name) { return py::reinterpret_steal<py::object>(PyObject_GetAttr(obj.ptr(), name)); };
  auto call = [&](PyObject* name) {
    py::object r = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(obj.ptr(), name));
    if (!r) throw py::error_already_set();
    return r;
  };
  py::object cpu = get(is_cpu);
  if (!cpu) throw py::error_already_set();
  if (cpu.ptr() != Py_True) {
    const std::string where = std::string(arg) + " is on device " + std::string(py::str(obj.attr("device")));
    if (obj.attr("is_cuda").ptr() == Py_True) throw DeviceBufferError(where);
    throw ValueError(where + "; ringcomm takes CPU and CUDA tensors");
  }
  if (call(is_contiguous).ptr() != Py_True) {
    throw ValueError(std::string(arg) + " must be contiguous (call .contiguous() first)");
  }
  Buffer b;
  py::object dt = get(dtype);
  if (!dt) throw py::error_already_set();
  b.dtype = from_torch_dtype(arg, dt);
  py::object size = get(nbytes);  // a property: cheaper than numel()
  if (!size) throw py::error_already_set();
  b.count = PyLong_AsSize_t(size.ptr()) / dtype_size(b.dtype);
  b.ptr = reinterpret_cast<char*>(PyLong_AsVoidPtr(call(data_ptr).ptr()));
  if (PyErr_Occurred()) throw py::error_already_set();
  b.present = true;
  return b;
}

Buffer from_array_interface(py::handle obj, const char* arg, bool writable) {
  py::dict ai = obj.attr("__array_interface__");
  py::tuple data = ai["data"];
  if (writable && data[1].cast<bool>()) throw ValueError(std::string(arg) + " is read-only");
  Buffer b;
  b.dtype = from_typestr(arg, ai["typestr"].cast<std::string>());
  py::tuple shape = ai["shape"];
  b.count = 1;
  for (auto d : shape) b.count *= d.cast<size_t>();
  if (ai.contains("strides") && !ai["strides"].is_none()) {
    // Accept strides only if they describe the C-contiguous layout.
    py::tuple strides = ai["strides"];
    Py_ssize_t expect = static_cast<Py_ssize_t>(dtype_size(b.dtype));
    for (Py_ssize_t i = static_cast<Py_ssize_t>(shape.size()) - 1; i >= 0; --i) {
      Py_ssize_t dim = shape[i].cast<Py_ssize_t>();
      if (dim > 1 && strides[i].cast<Py_ssize_t>() != expect) {
        throw ValueError(std::string(arg) + " must be contiguous");
      }
      expect *= dim;
    }
  }
  b.ptr = reinterpret_cast<char*>(data[0].cast<uintptr_t>());
  b.present = true;
  return b;
}

}  // namespace

Buffer buffer_from_python(py::handle obj, const char* arg, bool writable, bool allow_none) {
  if (obj.is_none()) {
    if (allow_none) return Buffer{};
    throw ValueError(std::string(arg) + " is required, got None");
  }
  if (is_torch_tensor(obj)) return from_torch(obj, arg);
  if (PyObject_CheckBuffer(obj.ptr())) {
    Py_buffer view;
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
      PyErr_Clear();
      if (writable && PyObject_GetBuffer(obj.ptr(), &view, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
        PyBuffer_Release(&view);
        throw ValueError(std::string(arg) + " is read-only but the call writes into it");
      }
      throw TypeError(std::string(arg) + ": cannot read its buffer");
    }
    struct Release {
      Py_buffer* v;
      ~Release() { PyBuffer_Release(v); }
    } release{&view};
    if (!PyBuffer_IsContiguous(&view, 'C')) {
      throw ValueError(std::string(arg) + " must be contiguous (numpy: np.ascontiguousarray)");
    }
    Buffer b;
    b.dtype = from_format(arg, view.format, view.itemsize);
    b.count = static_cast<size_t>(view.len / view.itemsize);
    b.ptr = static_cast<char*>(view.buf);
    b.present = true;
    return b;
  }
  if (py::hasattr(obj, "__array_interface__")) return from_array_interface(obj, arg, writable);
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    throw DeviceBufferError(std::string(arg) + " is in GPU memory (__cuda_array_interface__)");
  }
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple dev = obj.attr("__dlpack_device__")();
    if (dev.size() >= 1 && dev[0].cast<int>() != 1) {  // 1: kDLCPU
      throw DeviceBufferError(std::string(arg) + " is on DLPack device type " + std::to_string(dev[0].cast<int>()));
    }
  }
  throw TypeError(std::string(arg) + " must be a numpy array, a torch tensor or an object with the "
                  "buffer protocol / __array_interface__; got " +
                  std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

}  // namespace ringcomm
