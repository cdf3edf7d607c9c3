#include "comm/device_executor.h"

#include <algorithm>
#include <string>

namespace ringcomm {

DeviceExecutor::DeviceExecutor(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
  if (chunk_bytes_ < 64 || chunk_bytes_ % 64) {
    throw ValueError("ringcomm: the device chunk size must be a positive multiple of 64 bytes, got " +
                     std::to_string(chunk_bytes_));
  }
}

DeviceExecutor::~DeviceExecutor() {
  if (owner_) {
    owner_->free_scratch(recv_tmp_);
    owner_->free_scratch(send_tmp_);
  }
}

void DeviceExecutor::allocate(DeviceOps& ops) {
  if (owner_) return;
  recv_tmp_ = ops.alloc_scratch(chunk_bytes_);
  send_tmp_ = ops.alloc_scratch(chunk_bytes_);
  owner_ = &ops;
}

void DeviceExecutor::flush(DeviceOps& ops) {
  if (pending_.empty()) return;
  std::vector<P2pOp> group;
  group.swap(pending_);
  ops.group(group);
}

void DeviceExecutor::run(const Schedule& steps, const PlanBuffers& bufs, DeviceOps& ops, DataType dtype,
                         ReduceOp op) {
  const size_t elem = dtype_size(dtype);
  // Chunks hold whole elements (reductions split at element boundaries): the
  // chunk size is a multiple of 64, every element size divides it.
  const size_t chunk = chunk_bytes_;
  const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const int world = ops.world();
  auto reduce = [&](char* dst, const char* a, const char* b, size_t nbytes, bool divide) {
    ops.reduce(dtype, combine, dst, a, b, nbytes / elem);
    if (divide) ops.divide(dtype, dst, nbytes / elem, world);
  };
  auto send = [&](const char* p, size_t n, int peer) {
    pending_.push_back({true, const_cast<char*>(p), n, peer});
  };
  auto recv = [&](char* p, size_t n, int peer) { pending_.push_back({false, p, n, peer}); };
  pending_.clear();
  for (const Step& s : steps) {
    char* const dst = bufs.at(s.dst);
    const char* const src = bufs.at(s.src);
    // A step that waits for an earlier one (a tree forwards what it received)
    // starts a new group: NCCL runs the transfers of one group together.
    if (s.after != SIZE_MAX) flush(ops);
    switch (s.kind) {
      case StepKind::kSend:
        for (size_t off = 0; off < s.nbytes; off += chunk) send(src + off, std::min(chunk, s.nbytes - off), s.send_peer);
        break;
      case StepKind::kRecv:
        for (size_t off = 0; off < s.nbytes; off += chunk) recv(dst + off, std::min(chunk, s.nbytes - off), s.recv_peer);
        break;
      case StepKind::kRecvCopySend:
        for (size_t off = 0; off < s.nbytes; off += chunk) {
          const size_t n = std::min(chunk, s.nbytes - off);
          recv(dst + off, n, s.recv_peer);
          flush(ops);
          send(dst + off, n, s.send_peer);
        }
        break;
      case StepKind::kRecvReduce:
      case StepKind::kRecvReduceSend:
      case StepKind::kRecvReduceCopySend:
        allocate(ops);
        for (size_t off = 0; off < s.nbytes; off += chunk) {
          const size_t n = std::min(chunk, s.nbytes - off);
          recv(recv_tmp_, n, s.recv_peer);
          flush(ops);
          if (s.kind == StepKind::kRecvReduceSend) {
            // The chunk sent before this one has left send_tmp_: the group
            // just flushed held it, and the stream orders this kernel after.
            reduce(send_tmp_, src + off, recv_tmp_, n, false);
            send(send_tmp_, n, s.send_peer);
          } else {
            reduce(dst + off, src + off, recv_tmp_, n, s.divide);
            if (s.kind == StepKind::kRecvReduceCopySend) send(dst + off, n, s.send_peer);
          }
        }
        break;
      case StepKind::kLocalCopy:
        flush(ops);
        if (s.nbytes && dst != src) ops.copy(dst, src, s.nbytes);
        break;
      case StepKind::kLocalReduce:
        flush(ops);
        if (s.nbytes) reduce(dst, src, bufs.at(s.src2), s.nbytes, s.divide);
        break;
      case StepKind::kFence:
        flush(ops);
        break;
      default:
        throw Error("ringcomm: the device executor cannot run pull steps");
    }
  }
  flush(ops);
}

}  // namespace ringcomm
