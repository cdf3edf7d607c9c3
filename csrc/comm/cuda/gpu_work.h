// The handle of one GPU operation: a CUDA event recorded on the communicator's
// stream after the operation. Waiting never spins the GPU: wait_stream makes
// another stream wait on the event (no host block); synchronize blocks the
// host, polling the event and NCCL's asynchronous error state until the
// timeout.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

namespace ringcomm {

class GpuCommunicator;

class GpuWork {
 public:
  // `captured`: the operation was queued into a CUDA graph being captured;
  // there is no event to wait on (the graph orders it).
  GpuWork(std::shared_ptr<GpuCommunicator> owner, int device, cudaEvent_t done, bool captured, std::string what);
  ~GpuWork();
  GpuWork(const GpuWork&) = delete;
  GpuWork& operator=(const GpuWork&) = delete;

  // The caller's `stream` waits for the operation (host returns at once).
  void wait_stream(cudaStream_t stream);
  // Blocks the host until the operation finished; throws TimeoutError after
  // `timeout_s` (< 0: the communicator's timeout) and aborts the NCCL
  // communicator, or Error when NCCL reported an asynchronous error.
  void synchronize(double timeout_s);
  bool is_completed();
  const std::string& what() const { return what_; }
  bool captured() const { return captured_; }

 private:
  std::shared_ptr<GpuCommunicator> owner_;
  int device_;
  cudaEvent_t done_;
  bool captured_;
  std::string what_;
};

}  // namespace ringcomm
