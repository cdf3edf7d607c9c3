// Python objects -> Buffer (pointer, count, dtype), without linking any
// framework: the buffer protocol (numpy, memoryview, array), torch-like
// tensors through their Python attributes, and __array_interface__.
#pragma once

#include <pybind11/pybind11.h>

#include "comm/buffer.h"

namespace ringcomm {

// Raised for a buffer in GPU memory (a CUDA torch tensor, an object with
// __cuda_array_interface__ or a CUDA DLPack device): the Python layer sends
// such calls down the GPU path (ringcomm/cuda.py). A ValueError in Python.
class DeviceBufferError : public ValueError {
 public:
  using ValueError::ValueError;
};

// `arg` names the argument in error messages. None gives an absent Buffer
// when `allow_none`, else a ValueError. Raises TypeError for unsupported
// objects or dtypes, ValueError for non-contiguous, read-only (when
// `writable`) or non-CPU buffers.
Buffer buffer_from_python(pybind11::handle obj, const char* arg, bool writable, bool allow_none = false);

}  // namespace ringcomm
