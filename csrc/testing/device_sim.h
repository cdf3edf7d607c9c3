// An in-process stand-in for NCCL point-to-point groups over host memory, so
// the device executor (the GPU "ring" family's translation of schedules into
// grouped transfers and kernels) is tested on machines without a GPU.
//
// `world` ranks run on threads, each with its own DeviceExecutor and SimOps.
// Transfers between a pair of ranks match in the order they were posted, as in
// NCCL; a rank's group returns only once every transfer in it has matched and
// moved its data, the strictest reading of NCCL's group semantics (a send may
// not complete before its receive is posted), so a translation that could
// deadlock on a GPU deadlocks here too (and times out). Kernels run at once
// with the CPU reducers, which compute what the CUDA kernels compute.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "comm/device_executor.h"

namespace ringcomm {

class SimFabric {
 public:
  SimFabric(int world, double timeout_s);
  int world() const { return world_; }
  // Posts rank `rank`'s group and waits until all of it is done. Throws
  // TimeoutError when it is not done in time (a deadlock) and Error when a
  // send and its receive differ in size.
  void group(int rank, const std::vector<P2pOp>& ops);

 private:
  struct Posted {
    char* ptr;
    size_t nbytes;
    bool* done;
  };
  void match_locked();

  int world_;
  std::chrono::duration<double> timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Posted>> sends_, recvs_;  // by src * world + dst
  std::string error_;
};

class SimOps : public DeviceOps {
 public:
  SimOps(SimFabric* fabric, int rank) : fabric_(fabric), rank_(rank) {}
  int world() const override { return fabric_->world(); }
  void group(const std::vector<P2pOp>& ops) override { fabric_->group(rank_, ops); }
  void reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) override;
  void divide(DataType dtype, char* buf, size_t count, int divisor) override;
  void copy(char* dst, const char* src, size_t nbytes) override;
  char* alloc_scratch(size_t nbytes) override;
  void free_scratch(char* p) override;

 private:
  SimFabric* fabric_;
  int rank_;
};

}  // namespace ringcomm
