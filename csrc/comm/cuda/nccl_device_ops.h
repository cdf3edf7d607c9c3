// The device executor's operations on a real GPU: NCCL send/recv groups and
// ringcomm's CUDA kernels, queued on one stream.
#pragma once

#include <cuda_runtime_api.h>

#include "comm/device_executor.h"
#include "transport/nccl/nccl_comm.h"

namespace ringcomm {

class NcclDeviceOps : public DeviceOps {
 public:
  explicit NcclDeviceOps(NcclComm* comm) : comm_(comm) {}
  // The stream the next operations are queued on.
  void set_stream(cudaStream_t s) { stream_ = s; }

  int world() const override { return comm_->world(); }
  void group(const std::vector<P2pOp>& ops) override;
  void reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) override;
  void divide(DataType dtype, char* buf, size_t count, int divisor) override;
  void copy(char* dst, const char* src, size_t nbytes) override;
  char* alloc_scratch(size_t nbytes) override;
  void free_scratch(char* p) override;

 private:
  NcclComm* comm_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace ringcomm
