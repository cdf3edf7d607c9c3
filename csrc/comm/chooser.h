// The one algorithm chooser (after NCCL's tuning table, src/graph/tuning.cc):
// for a call it lists the candidate algorithms of the device that runs it,
// ranked fastest first, with every forcing folded in as a mask over that
// table: the communicator's setting for the op (RINGCOMM_ALGO on the CPU,
// RINGCOMM_GPU_ALGO over NCCL, RINGCOMM_IPC_ALGO over cuda_ipc) and the call's
// own algo=. The call runs the first candidate; explain() shows the list.
// The CPU, GPU and cuda_ipc communicators, the device simulation and the
// bindings all ask this file, and parse algorithm names through algo_choice.h.
//
// Ranking, per device:
//   cpu      the cost model's predicted seconds (comm/cost_model.h);
//   nccl     NCCL's own collective first, then ringcomm's schedules over
//            NCCL send/recv ("ring"); no GPU link has been measured, so these
//            carry no predicted time (NaN). NCCL is not a candidate where its
//            reduction differs from ringcomm's (bool, the bitwise ops, and
//            floating-point MIN/MAX, which NCCL computes with fminf/fmaxf
//            and so drops NaN where every other path propagates it);
//   cuda_ipc all_reduce: one-shot up to the one-shot threshold, two-shot up
//            to the two-shot threshold, then the ring (RINGCOMM_IPC_ONESHOT_MAX_BYTES,
//            RINGCOMM_IPC_TWOSHOT_MAX_BYTES; neither protocol beyond the IPC
//            stage); every other op: the ring family's schedules.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/algo_choice.h"
#include "comm/cost_model.h"
#include "ringcomm/types.h"

namespace ringcomm {

enum class Device : uint8_t { kCpu, kNccl, kIpc };
const char* device_name(Device d);

// The cuda_ipc all_reduce thresholds (settings agreed from rank 0).
struct IpcThresholds {
  size_t one_shot_max = 256 << 10;
  size_t two_shot_max = 4 << 20;
};

// What the chooser knows of a call.
struct ChoiceCall {
  OpKind kind = OpKind::kAllReduce;
  size_t bytes = 0;  // as the cost model counts them (call_model_bytes)
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  bool reduces = false;
  Algo requested = Algo::kAuto;  // the call's algo=
};

// What it knows of the communicator (the same on every rank, so every rank
// picks alike).
struct ChoiceContext {
  Device device = Device::kCpu;
  Algo configured = Algo::kAuto;   // the communicator's setting for this op
  const CostModel* model = nullptr;  // cpu: the agreed model
  bool pull_ok = false;            // cpu: every rank can read every peer's memory
  IpcThresholds ipc;               // cuda_ipc
  size_t ipc_stage_bytes = 0;      // cuda_ipc: the most one-shot / two-shot can hold
};

// From this size up, `auto`'s CPU collectives list the pull schedules among
// their candidates (unmodelled: the tuner tries them, the model never picks them).
constexpr size_t kPullCandidateBytes = size_t{16} << 20;

struct Candidate {
  Algo algo;
  double seconds;  // predicted; NaN where nothing is modelled
};

// The candidates the call may run, the one it runs first. Throws ValueError
// when a forcing names an algorithm the call cannot run here (the message
// says which setting and why).
std::vector<Candidate> candidates(const ChoiceContext& ctx, const ChoiceCall& call);
Algo choose(const ChoiceContext& ctx, const ChoiceCall& call);

// Whether NCCL's own reduction gives ringcomm's result for `dtype` and `op`
// (AVG: NCCL's SUM, then ringcomm's divide kernel).
bool nccl_reduces_alike(DataType dtype, ReduceOp op);

// An algorithm name as a device takes it: "auto" and the names the device
// runs (cpu: algo_choice.h's; nccl: nccl, ring; cuda_ipc: oneshot, twoshot,
// ring); ValueError naming `setting` otherwise.
Algo parse_device_algo(Device d, const std::string& name, const std::string& setting);

}  // namespace ringcomm
