// The handle of one GPU operation: a CUDA event recorded on the communicator's
// stream after the operation, and the operation's sequence number on the
// communicator (comm/fault_state.h: an operation that an error covers failed
// even though its event completes, as every event does after ncclCommAbort).
// Waiting never spins the GPU: wait_stream makes another stream wait on the
// event (no host block); wait_host / synchronize block the host, polling the
// event and the communicator's error state until the timeout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ringcomm {

class GpuCommunicator;

class GpuWork {
 public:
  // `seq`: the operation's sequence number; 0 with `captured` (queued into a
  // CUDA graph being captured: no event, the graph orders it).
  GpuWork(std::shared_ptr<GpuCommunicator> owner, int device, cudaEvent_t done, bool captured, uint64_t seq,
          std::string what);
  ~GpuWork();
  GpuWork(const GpuWork&) = delete;
  GpuWork& operator=(const GpuWork&) = delete;

  // The caller's `stream` waits for the operation (host returns at once).
  // Throws the operation's error when one is known already.
  void wait_stream(cudaStream_t stream);
  // Blocks the host until the operation finished or `timeout_s` (< 0: the
  // communicator's timeout) passed: false on timeout (the operation keeps
  // running). Throws the operation's error (TimeoutError when the watchdog
  // timed it out), or Error when NCCL reported an asynchronous error (the
  // communicator is then aborted).
  bool wait_host(double timeout_s);
  // wait_host, but a timeout aborts the NCCL communicator and throws
  // TimeoutError.
  void synchronize(double timeout_s);
  // Whether the operation's event completed (the GPU is done with its
  // buffers), whether it succeeded or not; safe during another thread's
  // graph capture.
  bool is_completed();
  // The error this operation failed with ("" if none, or none yet).
  std::string error() const;
  // Whether that error is a timeout.
  bool error_is_timeout() const;
  const std::string& what() const { return what_; }
  bool captured() const { return captured_; }
  uint64_t seq() const { return seq_; }

 private:
  [[noreturn]] void raise(const std::string& why) const;

  std::shared_ptr<GpuCommunicator> owner_;
  int device_;
  cudaEvent_t done_;
  bool captured_;
  uint64_t seq_;
  std::string what_;
};

}  // namespace ringcomm
