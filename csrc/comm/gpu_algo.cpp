#include "comm/gpu_algo.h"

namespace ringcomm {

GpuAlgo parse_gpu_algo(const std::string& name) {
  if (name == "auto" || name.empty()) return GpuAlgo::kAuto;
  if (name == "nccl") return GpuAlgo::kNccl;
  if (name == "ring") return GpuAlgo::kRing;
  throw ValueError("ringcomm: GPU algorithm '" + name + "' is not one of auto, nccl, ring");
}

const char* gpu_algo_name(GpuAlgo a) {
  switch (a) {
    case GpuAlgo::kAuto: return "auto";
    case GpuAlgo::kNccl: return "nccl";
    case GpuAlgo::kRing: return "ring";
  }
  return "?";
}

namespace {

// NCCL has every dtype but bool, and SUM, PROD, MIN, MAX (AVG runs as SUM).
bool nccl_has(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) return false;
  return op == ReduceOp::kSum || op == ReduceOp::kProd || op == ReduceOp::kMin || op == ReduceOp::kMax ||
         op == ReduceOp::kAvg;
}

bool drops_nan(DataType dtype, ReduceOp op) {
  return is_floating(dtype) && (op == ReduceOp::kMin || op == ReduceOp::kMax);
}

}  // namespace

bool nccl_reduces_alike(DataType dtype, ReduceOp op) { return nccl_has(dtype, op) && !drops_nan(dtype, op); }

GpuAlgo choose_gpu_family(GpuAlgo requested, GpuAlgo communicator_default, DataType dtype, ReduceOp op,
                          bool reduces) {
  const GpuAlgo algo = requested == GpuAlgo::kAuto ? communicator_default : requested;
  if (!reduces || algo == GpuAlgo::kRing) return algo == GpuAlgo::kAuto ? GpuAlgo::kNccl : algo;
  if (algo == GpuAlgo::kAuto) return nccl_reduces_alike(dtype, op) ? GpuAlgo::kNccl : GpuAlgo::kRing;
  const std::string forced = requested == GpuAlgo::kNccl ? "algo='nccl'" : "RINGCOMM_GPU_ALGO=nccl";
  if (!nccl_has(dtype, op)) {
    throw ValueError(std::string("ringcomm: NCCL has no ") +
                     (dtype == DataType::kBool ? std::string("dtype ") + dtype_name(dtype)
                                               : std::string("reduce op ") + reduce_op_name(op)) +
                     " (" + forced + "); use algo='ring' (or 'auto')");
  }
  if (drops_nan(dtype, op)) {
    throw ValueError(std::string("ringcomm: NCCL's ") + reduce_op_name(op) + " on " + dtype_name(dtype) +
                     " drops NaN where every other ringcomm path propagates it (" + forced +
                     "); use algo='ring' (or 'auto', which runs ringcomm's kernels for it)");
  }
  return GpuAlgo::kNccl;
}

}  // namespace ringcomm
