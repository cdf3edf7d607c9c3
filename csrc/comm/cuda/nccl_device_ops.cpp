#include "comm/cuda/nccl_device_ops.h"

#include "common/cuda/cuda_util.h"
#include "reduce/cuda/kernels.h"

namespace ringcomm {

void NcclDeviceOps::group(const std::vector<P2pOp>& ops) {
  const nccl::Api& a = nccl::api();
  comm_->check(a.GroupStart(), "ncclGroupStart");
  nccl::Result r = nccl::kSuccess;
  for (const P2pOp& p : ops) {
    r = p.send ? a.Send(p.ptr, p.nbytes, nccl::kUint8, p.peer, comm_->handle(), stream_)
               : a.Recv(p.ptr, p.nbytes, nccl::kUint8, p.peer, comm_->handle(), stream_);
    if (r != nccl::kSuccess) break;
  }
  const nccl::Result end = a.GroupEnd();
  comm_->check(r, "ncclSend/ncclRecv");
  comm_->check(end, "ncclGroupEnd");
}

void NcclDeviceOps::reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) {
  cuda::reduce(dtype, op, dst, a, b, count, stream_);
}

void NcclDeviceOps::divide(DataType dtype, char* buf, size_t count, int divisor) {
  cuda::divide(dtype, buf, count, divisor, stream_);
}

void NcclDeviceOps::copy(char* dst, const char* src, size_t nbytes) {
  cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
}

char* NcclDeviceOps::alloc_scratch(size_t nbytes) {
  void* p = nullptr;
  cuda::check(cudaMalloc(&p, nbytes), "cudaMalloc (ring scratch)");
  return static_cast<char*>(p);
}

void NcclDeviceOps::free_scratch(char* p) { cudaFree(p); }

}  // namespace ringcomm
