// Element-wise reduction kernels on the GPU: the CUDA counterpart of
// reduce/cpu/kernels.h, with the same results bit for bit (up to NaN payloads).
// Plain C++ on the outside, so host-only sources can include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "ringcomm/types.h"

namespace ringcomm::cuda {

// dst[i] = a[i] (op) b[i] for i < n, launched on `stream` (asynchronous). dst may be a or b
// exactly (in place); other overlaps are not allowed. For ReduceOp::kAvg this is the SUM
// (divide afterwards). The pointers must be device-accessible and aligned to the element size.
// Throws ValueError if the op is not defined for the dtype (or a pointer is misaligned) and
// Error with cudaGetErrorString's text if the launch fails. n == 0 launches nothing.
void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n,
            cudaStream_t stream);

// buf[i] = buf[i] / divisor for AVG (divisor >= 1), on `stream`: floats divide in their compute
// type (float32 for float16 / bfloat16) and round once; integers truncate toward zero.
// Throws ValueError for bool (no AVG), a divisor below 1 or a misaligned buf, Error if the
// launch fails. n == 0 launches nothing.
void divide(DataType dtype, void* buf, size_t n, int divisor, cudaStream_t stream);

}  // namespace ringcomm::cuda
