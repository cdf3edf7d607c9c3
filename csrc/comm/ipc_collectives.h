// Every collective over the cuda_ipc transport, for the GPU communicator
// (CUDA memory) and the CPU stand-in the tests drive (host shared memory):
// the schedules of csrc/algo through the device executor, and for all_reduce
// the one-shot and two-shot protocols of the channel, picked by size.
//
// all_reduce under "auto" (comm/chooser.h decides): bytes <= one_shot_max:
// one-shot; <= two_shot_max (and within the stage): two-shot; else the ring.
// The thresholds are settings (RINGCOMM_IPC_ONESHOT_MAX_BYTES, RINGCOMM_IPC_TWOSHOT_MAX_BYTES,
// agreed through the store from rank 0), to be set from the latencies that
// scripts/ipc_bench.py measures (scripts/gpu_check.sh runs it); the defaults
// (one-shot to 256 KiB, two-shot to 4 MiB) are guesses in the range such
// custom all-reduces use, not measurements.
#pragma once

#include <memory>

#include "comm/call_plan.h"
#include "comm/chooser.h"
#include "comm/device_executor.h"
#include "comm/ipc_device_ops.h"
#include "transport/cuda_ipc/ipc_channel.h"

namespace ringcomm {

class IpcCollectives {
 public:
  // The executor's chunk is the channel's slot size.
  IpcCollectives(std::unique_ptr<IpcChannel> channel, IpcThresholds thresholds);
  ~IpcCollectives();

  IpcChannel& channel() { return *ch_; }
  const IpcThresholds& thresholds() const { return th_; }
  // Scratch of the executor, before any use (and before graph capture).
  void allocate();

  // An all_reduce by `chosen` (the chooser's pick: kOneShot, kTwoShot, or
  // kRing: the schedules, of `family` (kAuto: the ring)).
  void all_reduce(uint64_t seq, char* x, size_t count, DataType dtype, ReduceOp op, Algo chosen,
                  Algo family = Algo::kAuto);
  // Any collective through its schedule (plan_call); call.algo picks the family.
  void run(const char* what, uint64_t seq, const AddressedCall& call, DataType dtype, ReduceOp op);
  void p2p(const char* what, uint64_t seq, const std::vector<IpcP2p>& ops);

 private:
  std::unique_ptr<IpcChannel> ch_;
  IpcThresholds th_;
  IpcDeviceOps ops_;
  DeviceExecutor executor_;
  Schedule schedule_;
  char* scratch_ = nullptr;  // the families that need scratch (call_plan.h scratch_bytes)
  size_t scratch_cap_ = 0;
};

}  // namespace ringcomm
