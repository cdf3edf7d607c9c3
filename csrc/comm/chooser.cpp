#include "comm/chooser.h"

#include <algorithm>
#include <limits>

namespace ringcomm {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// NCCL has every dtype but bool, and SUM, PROD, MIN, MAX (AVG runs as SUM).
bool nccl_has(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) return false;
  return op == ReduceOp::kSum || op == ReduceOp::kProd || op == ReduceOp::kMin || op == ReduceOp::kMax ||
         op == ReduceOp::kAvg;
}

bool drops_nan(DataType dtype, ReduceOp op) {
  return is_floating(dtype) && (op == ReduceOp::kMin || op == ReduceOp::kMax);
}

// Which setting forced `a` (for messages).
std::string forced_by(const ChoiceContext& ctx, const ChoiceCall& call, Algo a) {
  const std::string name = algo_name(a);
  if (call.requested != Algo::kAuto) return "algo='" + name + "'";
  switch (ctx.device) {
    case Device::kCpu: return "RINGCOMM_ALGO=" + name;
    case Device::kNccl: return "RINGCOMM_GPU_ALGO=" + name;
    case Device::kIpc: return "RINGCOMM_IPC_ALGO=" + name;
  }
  return name;
}

Algo forced_algo(const ChoiceContext& ctx, const ChoiceCall& call) {
  return call.requested != Algo::kAuto ? call.requested : ctx.configured;
}

// The collectives whose bulk passes the FIFO and that have a pull schedule.
bool pull_tunable(OpKind k) {
  return k == OpKind::kAllReduce || k == OpKind::kReduceScatter || k == OpKind::kAllGather ||
         k == OpKind::kBroadcast || k == OpKind::kReduce;
}

double cpu_seconds(const ChoiceContext& ctx, const ChoiceCall& call, Algo a) {
  if (!ctx.model || a == Algo::kPull) return kNaN;
  try {
    return ctx.model->seconds(call.kind, a, call.bytes);
  } catch (const ValueError&) {
    return kNaN;  // not modelled for this call (a size past the family's limit)
  }
}

// What an `auto` or a forced choice means on each device (no allocation:
// every synchronous CPU call asks).
Algo choose_cpu(const ChoiceContext& ctx, const ChoiceCall& call) {
  const Algo forced = forced_algo(ctx, call);
  // Collectives pick among the FIFO schedules (pull is a candidate of large
  // ones for the tuner only, see candidates()): measured here, their
  // cache-resident slots mostly beat the kernel's cross-process copy
  // (docs/performance.md). Forced pull where some rank cannot read its
  // peers' memory runs the op's default family instead (every rank knows).
  if (forced == Algo::kPull) return ctx.pull_ok ? Algo::kPull : default_algo(call.kind);
  if (forced != Algo::kAuto) {
    if (!algo_has(call.kind, forced)) {
      throw ValueError(std::string(op_kind_name(call.kind)) + " has no " + algo_name(forced) + " schedule (" +
                       forced_by(ctx, call, forced) + ")");
    }
    return forced;
  }
  return ctx.model ? ctx.model->pick(call.kind, call.bytes) : default_algo(call.kind);
}

Algo choose_nccl(const ChoiceContext& ctx, const ChoiceCall& call) {
  const Algo algo = forced_algo(ctx, call);
  if (algo == Algo::kOneShot || algo == Algo::kTwoShot) {
    throw ValueError(std::string("algo '") + algo_name(algo) +
                     "' needs the cuda_ipc transport (RINGCOMM_TRANSPORT=cuda_ipc or init(transport='cuda_ipc')); "
                     "this communicator runs over NCCL");
  }
  if (algo != Algo::kAuto && algo != Algo::kNccl && algo != Algo::kRing) {
    throw ValueError(std::string("ringcomm: GPU algorithm '") + algo_name(algo) + "' is not one of auto, nccl, ring");
  }
  if (!call.reduces || algo == Algo::kRing) return algo == Algo::kAuto ? Algo::kNccl : algo;
  if (algo == Algo::kAuto) return nccl_reduces_alike(call.dtype, call.op) ? Algo::kNccl : Algo::kRing;
  const std::string forced = forced_by(ctx, call, Algo::kNccl);
  if (!nccl_has(call.dtype, call.op)) {
    throw ValueError(std::string("ringcomm: NCCL has no ") +
                     (call.dtype == DataType::kBool ? std::string("dtype ") + dtype_name(call.dtype)
                                                    : std::string("reduce op ") + reduce_op_name(call.op)) +
                     " (" + forced + "); use algo='ring' (or 'auto')");
  }
  if (drops_nan(call.dtype, call.op)) {
    throw ValueError(std::string("ringcomm: NCCL's ") + reduce_op_name(call.op) + " on " + dtype_name(call.dtype) +
                     " drops NaN where every other ringcomm path propagates it (" + forced +
                     "); use algo='ring' (or 'auto', which runs ringcomm's kernels for it)");
  }
  return Algo::kNccl;
}

Algo choose_ipc(const ChoiceContext& ctx, const ChoiceCall& call) {
  // The per-call algo= wins; the setting (RINGCOMM_IPC_ALGO) names all_reduce's protocol only.
  const Algo algo = call.requested != Algo::kAuto ? call.requested
                    : call.kind == OpKind::kAllReduce ? ctx.configured
                                                       : Algo::kAuto;
  if (algo == Algo::kNccl) {
    throw ValueError("algo 'nccl' needs the NCCL transport; this communicator runs over cuda_ipc (ring "
                     "schedules, one-shot and two-shot all_reduce)");
  }
  if (algo != Algo::kAuto && algo != Algo::kRing && algo != Algo::kOneShot && algo != Algo::kTwoShot) {
    throw ValueError(std::string("cuda_ipc all_reduce algorithm '") + algo_name(algo) +
                     "' is not one of auto, oneshot, twoshot, ring");
  }
  if (call.kind != OpKind::kAllReduce) {
    if (algo == Algo::kOneShot || algo == Algo::kTwoShot) {
      throw ValueError(std::string("cuda_ipc: ") + algo_name(algo) + " is an all_reduce protocol; " +
                       op_kind_name(call.kind) + " runs the ring family's schedules");
    }
    return Algo::kRing;
  }
  const size_t stage = ctx.ipc_stage_bytes;
  if (algo == Algo::kOneShot || algo == Algo::kTwoShot) {
    if (call.bytes > stage) {
      throw ValueError(std::string("cuda_ipc: ") + algo_name(algo) + " all_reduce of " + std::to_string(call.bytes) +
                       " bytes exceeds the IPC stage of " + std::to_string(stage) +
                       " bytes (RINGCOMM_IPC_STAGE_BYTES)");
    }
    return algo;
  }
  if (algo == Algo::kRing) return algo;
  if (call.bytes <= std::min(ctx.ipc.one_shot_max, stage)) return Algo::kOneShot;
  if (call.bytes <= std::min(ctx.ipc.two_shot_max, stage)) return Algo::kTwoShot;
  return Algo::kRing;
}

}  // namespace

const char* device_name(Device d) {
  switch (d) {
    case Device::kCpu: return "cpu";
    case Device::kNccl: return "nccl";
    case Device::kIpc: return "cuda_ipc";
  }
  return "?";
}

bool nccl_reduces_alike(DataType dtype, ReduceOp op) { return nccl_has(dtype, op) && !drops_nan(dtype, op); }

Algo choose(const ChoiceContext& ctx, const ChoiceCall& call) {
  switch (ctx.device) {
    case Device::kCpu: return choose_cpu(ctx, call);
    case Device::kNccl: return choose_nccl(ctx, call);
    case Device::kIpc: return choose_ipc(ctx, call);
  }
  return Algo::kAuto;
}

std::vector<Candidate> candidates(const ChoiceContext& ctx, const ChoiceCall& call) {
  const Algo first = choose(ctx, call);
  std::vector<Candidate> out;
  auto add = [&](Algo a, double s) {
    for (const Candidate& c : out) {
      if (c.algo == a) return;
    }
    out.push_back({a, s});
  };
  switch (ctx.device) {
    case Device::kCpu: {
      add(first, cpu_seconds(ctx, call, first));
      if (ctx.model) {
        for (const Prediction& p : ctx.model->predict(call.kind, call.bytes)) add(p.algo, p.seconds);
      }
      // Large collectives of one host also have the single-copy pulls, unmodelled
      // (so never the model's pick): the FIFO's slots pass from core to core
      // through the caches, which some placements of a VM's cores make 4-5x
      // slower for whole runs, where a pull streams from memory alike in
      // every placement (docs/performance.md). The tuner measures both when
      // the pick runs far from its prediction, and keeps the faster.
      if (ctx.model && ctx.pull_ok && call.bytes >= kPullCandidateBytes && pull_tunable(call.kind)) {
        add(Algo::kPull, kNaN);
      }
      break;
    }
    case Device::kNccl: {
      add(first, kNaN);
      if (!call.reduces || nccl_reduces_alike(call.dtype, call.op)) add(Algo::kNccl, kNaN);
      add(Algo::kRing, kNaN);
      break;
    }
    case Device::kIpc: {
      add(first, kNaN);
      if (call.kind == OpKind::kAllReduce && call.bytes <= ctx.ipc_stage_bytes) {
        add(Algo::kOneShot, kNaN);
        add(Algo::kTwoShot, kNaN);
      }
      add(Algo::kRing, kNaN);
      break;
    }
  }
  return out;
}

Algo parse_device_algo(Device d, const std::string& name, const std::string& setting) {
  if (name.empty() || name == "auto") return Algo::kAuto;
  Algo a;
  const bool known = parse_algo_name(name, &a);
  bool ok = false;
  const char* names = "";
  switch (d) {
    case Device::kCpu:
      ok = known && a != Algo::kNccl && a != Algo::kTwoShot;
      names = "auto, ring, oneshot, pull, recursive_doubling, rabenseifner, tree, bruck, hierarchical, direct";
      break;
    case Device::kNccl:
      ok = known && (a == Algo::kNccl || a == Algo::kRing);
      names = "auto, nccl, ring";
      break;
    case Device::kIpc:
      ok = known && (a == Algo::kOneShot || a == Algo::kTwoShot || a == Algo::kRing);
      names = "auto, oneshot, twoshot, ring";
      break;
  }
  if (!ok) {
    throw ValueError(setting + "=" + "'" + name + "' is not one of " + names + " (" + device_name(d) + ")");
  }
  return a;
}

}  // namespace ringcomm
