// The device executor's operations over the cuda_ipc transport: point-to-point
// groups go through the IPC protocol (transport/cuda_ipc/ipc_channel.h),
// kernels and copies to the channel's memory (host or CUDA). With it the
// schedules of csrc/algo run over cuda_ipc exactly as they run over NCCL.
#pragma once

#include "comm/device_executor.h"
#include "transport/cuda_ipc/ipc_channel.h"

namespace ringcomm {

class IpcDeviceOps : public DeviceOps {
 public:
  explicit IpcDeviceOps(IpcChannel* channel) : ch_(channel) {}
  int world() const override { return ch_->world(); }
  void group(const std::vector<P2pOp>& ops) override {
    std::vector<IpcP2p> p;
    p.reserve(ops.size());
    for (const P2pOp& o : ops) p.push_back({o.send, o.ptr, o.nbytes, o.peer});
    ch_->group(p);
  }
  void reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) override {
    ch_->memory().reduce(dtype, op, dst, a, b, count);
  }
  void divide(DataType dtype, char* buf, size_t count, int divisor) override {
    ch_->memory().divide(dtype, buf, count, divisor);
  }
  void copy(char* dst, const char* src, size_t nbytes) override { ch_->memory().copy(dst, src, nbytes); }
  char* alloc_scratch(size_t nbytes) override { return ch_->memory().alloc_scratch(nbytes); }
  void free_scratch(char* p) override { ch_->memory().free_scratch(p); }

 private:
  IpcChannel* ch_;
};

}  // namespace ringcomm
