// Runs a Schedule from algo/ as device operations: the GPU "ring" family.
//
// The same schedules the CPU executes (ring reduce-scatter / all-gather /
// all-reduce, chain broadcast / reduce, direct scatter / gather / all-to-all)
// become grouped point-to-point transfers (NCCL send/recv) and reduction
// kernels, queued in order on one stream. Steps are cut into chunks; sends and
// receives are queued inside groups (ncclGroupStart/End), and a group is closed
// only where a kernel needs data received in it (a receive-reduce, a forward,
// a local step). Each chunk's receive thus shares a group with the sends
// issued before it, which pairs every rank's group k with its neighbours'
// group k in the ring and chain patterns (no rank waits on a send its peer has
// not queued).
//
// The device is reached through DeviceOps: NCCL + CUDA in production
// (comm/cuda/nccl_device_ops.cpp), an in-process simulation of NCCL's group
// semantics over host memory in the tests (testing/device_sim.cpp), so this
// translation is tested on machines without a GPU.
#pragma once

#include <cstddef>
#include <vector>

#include "algo/step.h"
#include "ringcomm/types.h"

namespace ringcomm {

// One point-to-point transfer of a group.
struct P2pOp {
  bool send;
  char* ptr;
  size_t nbytes;
  int peer;
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual int world() const = 0;
  // One group of transfers: all of them progress together; group_end returns
  // once they are queued (NCCL) or done (simulation).
  virtual void group(const std::vector<P2pOp>& ops) = 0;
  // dst[i] = a[i] (op) b[i]; op is never AVG (SUM, then divide).
  virtual void reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) = 0;
  virtual void divide(DataType dtype, char* buf, size_t count, int divisor) = 0;
  virtual void copy(char* dst, const char* src, size_t nbytes) = 0;
  // Device scratch of `nbytes` (freed by free_scratch).
  virtual char* alloc_scratch(size_t nbytes) = 0;
  virtual void free_scratch(char* p) = 0;
};

class DeviceExecutor {
 public:
  // `chunk_bytes`: the most one send/recv moves (a positive multiple of 64).
  explicit DeviceExecutor(size_t chunk_bytes);
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  size_t chunk_bytes() const { return chunk_bytes_; }
  // Allocates the scratch (two chunks) through `ops`, once; before any CUDA
  // graph capture, where allocation is not allowed.
  void allocate(DeviceOps& ops);

  // Queues `steps` over the call's device buffers `bufs` (each step's
  // BufRefs resolve against them; a kept plan runs on any call's buffers):
  // dtype / op for the reduction steps (AVG: SUM, and steps with `divide`
  // divide by the world size).
  void run(const Schedule& steps, const PlanBuffers& bufs, DeviceOps& ops, DataType dtype, ReduceOp op);

 private:
  void flush(DeviceOps& ops);

  size_t chunk_bytes_;
  DeviceOps* owner_ = nullptr;  // who allocated the scratch
  char* recv_tmp_ = nullptr;    // a received chunk waiting to be reduced
  char* send_tmp_ = nullptr;    // a reduced chunk waiting to be sent
  std::vector<P2pOp> pending_;
};

}  // namespace ringcomm
