// check_call for Python: the GPU path (python/ringcomm/cuda.py) and the torch
// backend reach the one call check (comm/call_check.h) through it, so no
// rule is written again in Python. Buffers arrive as (ptr, count, dtype)
// tuples or None.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/bind.h"
#include "comm/call_check.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

Buffer buffer_arg(const py::object& o, const char* arg) {
  Buffer b;
  if (o.is_none()) return b;
  py::tuple t = o.cast<py::tuple>();
  if (t.size() != 3) throw TypeError(std::string(arg) + ": expected (ptr, count, dtype) or None");
  const int dtype = t[2].cast<int>();
  if (dtype < 0 || dtype >= kNumDataTypes) throw ValueError(std::string(arg) + ": dtype " + std::to_string(dtype) + " is not a DataType");
  b.ptr = reinterpret_cast<char*>(t[0].cast<uintptr_t>());
  b.count = t[1].cast<size_t>();
  b.dtype = static_cast<DataType>(dtype);
  b.present = true;
  return b;
}

}  // namespace

void bind_call_check(py::module_& m) {
  m.def(
      "check_call",
      [](const std::string& op, int rank, int world, const py::object& output, const py::object& input, int root,
         int redop) {
        if (redop < 0 || redop > 255) throw ValueError("invalid reduce op code " + std::to_string(redop));
        const Buffer out = buffer_arg(output, "output"), in = buffer_arg(input, "input");
        if (op == "send" || op == "recv") {
          check_call(describe_p2p(op == "send", rank, world, out, root));
          return;
        }
        check_call(describe_call(collective_arg(op), rank, world, out, in, root, static_cast<ReduceOp>(redop)));
      },
      py::arg("op"), py::arg("rank"), py::arg("world"), py::arg("output"), py::arg("input") = py::none(),
      py::arg("root") = -1, py::arg("redop") = 0,
      "Raises TypeError / ValueError as every communicator does for this call (comm/call_check.h); "
      "output / input: (ptr, count, dtype) or None; send/recv: the buffer as output, the peer as root.");
  m.def(
      "check_same_dtype",
      [](const std::string& op, const std::string& output, const std::string& input) {
        check_same_dtype_names(op.c_str(), output.c_str(), input.c_str());
      },
      py::arg("op"), py::arg("output"), py::arg("input"),
      "TypeError unless the two dtype names agree (the communicators' rule, for callers whose buffers are lists).");
}

}  // namespace ringcomm
