#include "comm/cuda/gpu_executor.h"

#include <algorithm>

#include "comm/cuda/cuda_util.h"
#include "reduce/cuda/kernels.h"

namespace ringcomm {

GpuExecutor::~GpuExecutor() {
  if (scratch_device_ >= 0) {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(scratch_device_);
    cudaFree(recv_tmp_);
    cudaFree(send_tmp_);
    if (previous >= 0) cudaSetDevice(previous);
  }
}

void GpuExecutor::allocate() {
  if (recv_tmp_) return;
  if (chunk_bytes_ < 64 || chunk_bytes_ % 64) {
    throw ValueError("ringcomm: the GPU chunk size must be a positive multiple of 64 bytes, got " +
                     std::to_string(chunk_bytes_));
  }
  cuda::check(cudaGetDevice(&scratch_device_), "cudaGetDevice");
  cuda::check(cudaMalloc(reinterpret_cast<void**>(&recv_tmp_), chunk_bytes_), "cudaMalloc (ring scratch)");
  cuda::check(cudaMalloc(reinterpret_cast<void**>(&send_tmp_), chunk_bytes_), "cudaMalloc (ring scratch)");
}

void GpuExecutor::flush(NcclComm& comm, cudaStream_t stream) {
  if (pending_.empty()) return;
  const nccl::Api& a = nccl::api();
  comm.check(a.GroupStart(), "ncclGroupStart");
  nccl::Result r = nccl::kSuccess;
  for (const P2p& p : pending_) {
    r = p.send ? a.Send(p.ptr, p.nbytes, nccl::kUint8, p.peer, comm.handle(), stream)
               : a.Recv(const_cast<char*>(p.ptr), p.nbytes, nccl::kUint8, p.peer, comm.handle(), stream);
    if (r != nccl::kSuccess) break;
  }
  pending_.clear();
  nccl::Result end = a.GroupEnd();
  comm.check(r, "ncclSend/ncclRecv");
  comm.check(end, "ncclGroupEnd");
}

void GpuExecutor::run(const Schedule& steps, NcclComm& comm, cudaStream_t stream, DataType dtype,
                      ReduceOp op) {
  const size_t elem = dtype_size(dtype);
  // Chunks hold whole elements (reductions split at element boundaries).
  const size_t chunk = std::max(elem, chunk_bytes_ / elem * elem);
  const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const int world = comm.world();
  auto reduce = [&](char* dst, const char* a, const char* b, size_t nbytes, bool divide) {
    cuda::reduce(dtype, combine, dst, a, b, nbytes / elem, stream);
    if (divide) cuda::divide(dtype, dst, nbytes / elem, world, stream);
  };
  pending_.clear();
  for (const Step& s : steps) {
    switch (s.kind) {
      case StepKind::kSend:
        for (size_t off = 0; off < s.nbytes; off += chunk) {
          add_send(s.src + off, std::min(chunk, s.nbytes - off), s.send_peer);
        }
        break;
      case StepKind::kRecv:
        for (size_t off = 0; off < s.nbytes; off += chunk) {
          add_recv(s.dst + off, std::min(chunk, s.nbytes - off), s.recv_peer);
        }
        break;
      case StepKind::kRecvCopySend:
        for (size_t off = 0; off < s.nbytes; off += chunk) {
          const size_t n = std::min(chunk, s.nbytes - off);
          add_recv(s.dst + off, n, s.recv_peer);
          flush(comm, stream);
          add_send(s.dst + off, n, s.send_peer);
        }
        break;
      case StepKind::kRecvReduce:
      case StepKind::kRecvReduceSend:
      case StepKind::kRecvReduceCopySend:
        allocate();
        for (size_t off = 0; off < s.nbytes; off += chunk) {
          const size_t n = std::min(chunk, s.nbytes - off);
          add_recv(recv_tmp_, n, s.recv_peer);
          flush(comm, stream);
          if (s.kind == StepKind::kRecvReduceSend) {
            // The chunk sent before this one has left send_tmp_: the group
            // just flushed held it, and the stream orders this kernel after.
            reduce(send_tmp_, s.src + off, recv_tmp_, n, false);
            add_send(send_tmp_, n, s.send_peer);
          } else {
            reduce(s.dst + off, s.src + off, recv_tmp_, n, s.divide);
            if (s.kind == StepKind::kRecvReduceCopySend) add_send(s.dst + off, n, s.send_peer);
          }
        }
        break;
      case StepKind::kLocalCopy:
        flush(comm, stream);
        if (s.nbytes && s.dst != s.src) {
          cuda::check(cudaMemcpyAsync(s.dst, s.src, s.nbytes, cudaMemcpyDeviceToDevice, stream),
                      "cudaMemcpyAsync");
        }
        break;
      case StepKind::kLocalReduce:
        flush(comm, stream);
        if (s.nbytes) reduce(s.dst, s.src, s.src2, s.nbytes, s.divide);
        break;
      case StepKind::kFence:
        flush(comm, stream);
        break;
      default:
        throw Error("ringcomm: the GPU executor cannot run pull steps");
    }
  }
  flush(comm, stream);
}

}  // namespace ringcomm
