// Type-erased reductions: one function pointer chosen once per call, as in Gloo.
#pragma once

#include <cstddef>

#include "ringcomm/types.h"

namespace ringcomm {

// dst[i] = a[i] (op) b[i] for i < n elements. dst may be a or b (in place);
// other overlaps are not allowed. Half types are computed in float32 and
// rounded once.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t n);

// buf[i] = buf[i] / divisor (divisor >= 1), for AVG. Floats divide in their compute type
// (float32 for the half types) and round once; integers truncate toward zero.
using DivideFn = void (*)(void* buf, size_t n, int divisor);

struct Reducer {
  DataType dtype;
  ReduceOp op;
  size_t elem_size;
  ReduceFn fn;         // for AVG: the SUM function
  DivideFn divide;     // non-null only for AVG
};

// Throws ValueError if op is not defined for dtype. The returned functions
// use the widest vector ISA this CPU supports (chosen once per process).
Reducer make_reducer(DataType dtype, ReduceOp op);

// Name of the instruction set the reductions run with ("avx2", "baseline").
const char* reducer_isa();

}  // namespace ringcomm
