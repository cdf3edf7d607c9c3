// Dtype / reduce-op helpers and build facts; also small pure functions
// exposed so the tests can check them without starting any process.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "algo/blocks.h"
#include "bindings/bind.h"
#include "bindings/buffers.h"
#include "bindings/calls.h"
#include "ringcomm/copy.h"
#include "ringcomm/reducer.h"

namespace py = pybind11;

namespace ringcomm {

void bind_types(py::module_& m) {
  m.def("build_info", [] {
    py::dict d;
#ifdef RINGCOMM_WITH_CUDA
    // Compiled in; whether a GPU and NCCL are present is asked at run time
    // (ringcomm.cuda_available(), ringcomm.nccl_version()).
    d["cuda"] = true;
    d["cuda_toolkit"] = RINGCOMM_CUDA_TOOLKIT_VERSION;
    d["cuda_archs"] = RINGCOMM_CUDA_ARCHS;
    d["nccl"] = true;  // the NCCL transport (libnccl.so.2 loaded on first use)
#ifdef RINGCOMM_HAVE_NCCL_H
    d["nccl_declarations"] = "checked against nccl.h";
#else
    d["nccl_declarations"] = "ringcomm's own (no nccl.h at build time)";
#endif
#else
    d["cuda"] = false;
    d["nccl"] = false;
#endif
    d["transports"] = py::make_tuple("shm", "tcp");
#ifdef RINGCOMM_WITH_CUDA
    d["gpu_transports"] = py::make_tuple("nccl", "cuda_ipc");
#else
    d["gpu_transports"] = py::make_tuple();
#endif
    d["reduce_isa"] = reducer_isa();
    d["compiler"] = __VERSION__;
    return d;
  });
  m.def("dtype_name", [](int t) { return std::string(dtype_name(static_cast<DataType>(t))); });
  m.def("reduce_op_supported", [](int t, int op) {
    return reduce_op_supported(static_cast<DataType>(t), static_cast<ReduceOp>(op));
  });
  m.def("ring_block", [](size_t count, int n, int i) {
    Range r = ring_block(count, n, i);
    return py::make_tuple(r.offset, r.count);
  });
  m.def("buffer_info", [](py::handle obj) {
    Buffer b = buffer_from_python(obj, "buffer", false);
    return py::make_tuple(reinterpret_cast<uintptr_t>(b.ptr), b.count, static_cast<int>(b.dtype));
  });
  // dst <- a (op) b, and AVG's division by `divisor`: the kernels alone.
  m.def("local_reduce", [](py::handle dst, py::handle a, py::handle b, int op, int divisor) {
    Buffer d = buffer_from_python(dst, "dst", true);
    Buffer x = buffer_from_python(a, "a", false);
    Buffer y = buffer_from_python(b, "b", false);
    if (d.dtype != x.dtype || d.dtype != y.dtype || d.count != x.count || d.count != y.count) {
      throw ValueError("local_reduce: dst, a and b must have the same dtype and size");
    }
    Reducer r = make_reducer(d.dtype, static_cast<ReduceOp>(op));
    without_gil([&] {
      r.fn(d.ptr, x.ptr, y.ptr, d.count);
      if (r.divide) r.divide(d.ptr, d.count, divisor);
    });
  }, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("op"), py::arg("divisor") = 1);
  // The copy received data of large messages is written out with.
  m.def("copy_streaming", [](py::handle dst, py::handle src) {
    Buffer d = buffer_from_python(dst, "dst", true);
    Buffer s = buffer_from_python(src, "src", false);
    if (d.nbytes() != s.nbytes()) throw ValueError("copy_streaming: dst and src differ in size");
    without_gil([&] { copy_streaming(d.ptr, s.ptr, d.nbytes()); });
  }, py::arg("dst"), py::arg("src"));
}

}  // namespace ringcomm
