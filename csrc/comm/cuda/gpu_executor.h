// Runs a Schedule from algo/ on a CUDA stream: "ring" family on the GPU.
//
// The same schedules the CPU executes (ring reduce-scatter / all-gather /
// all-reduce, chain broadcast / reduce, direct scatter / gather / all-to-all)
// become NCCL point-to-point calls and ringcomm's CUDA reduction kernels, all
// queued on one stream. Steps are cut into chunks; sends and receives are
// queued inside ncclGroupStart/End groups, and a group is closed only where a
// kernel needs data received in it (a receive-reduce, a forward, a local
// step). Each chunk's receive thus shares a group with the sends issued
// before it, which pairs every rank's group k with its neighbours' group k in
// the ring and chain patterns (no rank waits on a send its peer has not
// queued).
#pragma once

#include <cuda_runtime_api.h>

#include "algo/step.h"
#include "ringcomm/types.h"
#include "transport/nccl/nccl_comm.h"

namespace ringcomm {

class GpuExecutor {
 public:
  // `chunk_bytes`: the most one send/recv moves. Scratch (two chunks) is
  // allocated on the current device on first use.
  explicit GpuExecutor(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}
  ~GpuExecutor();
  GpuExecutor(const GpuExecutor&) = delete;
  GpuExecutor& operator=(const GpuExecutor&) = delete;

  size_t chunk_bytes() const { return chunk_bytes_; }
  // Allocates the scratch on the current device (once; before any CUDA graph
  // capture, where allocation is not allowed).
  void allocate();

  // Queues `steps` on `stream`. dtype / op / world: for the reduction steps
  // (op is SUM for AVG; steps with `divide` divide by world).
  void run(const Schedule& steps, NcclComm& comm, cudaStream_t stream, DataType dtype, ReduceOp op);

 private:
  struct P2p {
    bool send;
    const char* ptr;
    size_t nbytes;
    int peer;
  };
  void add_send(const char* p, size_t n, int peer) { pending_.push_back({true, p, n, peer}); }
  void add_recv(char* p, size_t n, int peer) { pending_.push_back({false, p, n, peer}); }
  void flush(NcclComm& comm, cudaStream_t stream);

  size_t chunk_bytes_;
  char* recv_tmp_ = nullptr;  // device: a received chunk waiting to be reduced
  char* send_tmp_ = nullptr;  // device: a reduced chunk waiting to be sent
  int scratch_device_ = -1;
  std::vector<P2p> pending_;
};

}  // namespace ringcomm
