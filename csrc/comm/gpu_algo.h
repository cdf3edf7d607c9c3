// Which family a GPU call runs: "nccl" (NCCL's own collective) or "ring"
// (ringcomm's schedules over NCCL send/recv with ringcomm's CUDA kernels).
// Pure and CUDA-free, so that the rule is compiled into every build and the
// tests check it without a GPU; GpuCommunicator::choose is this function.
//
// One NaN semantics on every device and family: MIN and MAX propagate NaN
// (like torch.maximum / numpy.maximum: a NaN in any rank's input at a position
// makes that position NaN on every rank that receives the result), and so do
// SUM, PROD and AVG (IEEE arithmetic). NCCL's floating-point MIN/MAX drop NaN:
// its src/device/reduce_kernel.h reduces float with fminf / fmaxf, double with
// fmin / fmax and half / bfloat16 with __hmin / __hmax, which all return the
// other operand when one is NaN. So:
// - under "auto", floating-point MIN/MAX go to the ring family, as do bool and
//   the bitwise ops (NCCL has neither);
// - "nccl" forced (per call or by RINGCOMM_GPU_ALGO) for a floating-point MIN
//   or MAX is refused with a ValueError rather than giving other answers than
//   every other path.
#pragma once

#include <string>

#include "ringcomm/types.h"

namespace ringcomm {

enum class GpuAlgo { kAuto, kNccl, kRing };
GpuAlgo parse_gpu_algo(const std::string& name);  // "auto" | "nccl" | "ring"; ValueError otherwise
const char* gpu_algo_name(GpuAlgo a);

// Whether NCCL's own reduction gives ringcomm's result for `dtype` and `op`
// (AVG: NCCL's SUM, then ringcomm's divide kernel).
bool nccl_reduces_alike(DataType dtype, ReduceOp op);

// The family (kNccl or kRing) a call runs. `requested` is the call's algo=;
// kAuto there means the communicator's `communicator_default` (from
// RINGCOMM_GPU_ALGO). `reduces`: whether the call combines values (calls that
// only move data go to NCCL as bytes, whatever the dtype). Throws ValueError
// when NCCL is forced on a call it cannot run alike.
GpuAlgo choose_gpu_family(GpuAlgo requested, GpuAlgo communicator_default, DataType dtype, ReduceOp op,
                          bool reduces);

}  // namespace ringcomm
