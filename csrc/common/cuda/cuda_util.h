// Small CUDA runtime helpers for the GPU path: error checks that throw
// ringcomm::Error, a guard that makes a device current for a scope, and the
// capture-mode helpers that keep polling threads out of other threads' CUDA
// graph captures.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ringcomm/types.h"

namespace ringcomm::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(std::string("ringcomm: ") + what + " failed: " + cudaGetErrorName(e) + ": " +
                cudaGetErrorString(e));
  }
}

// Whether `device`'s primary context is active (torch's c10::cuda::hasPrimaryContext),
// through the driver's cuDevicePrimaryCtxGetState fetched from the runtime (the
// module links no libcuda). A driver that cannot say counts as active: restoring
// a device is then what the guard did before.
bool has_primary_context(int device);

// Makes `device` current for the scope. On leaving it restores the previous
// device only where that device really was in use: a thread that had never
// touched CUDA reads "device 0" from cudaGetDevice, and setting device 0 back
// would create a primary context there (about 0.5 GB of GPU 0 per process on a
// multi-GPU node). As torch's MaybeSetDevice, such a thread is left on `device`.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      restore_ = has_primary_context(previous_);
      check(cudaSetDevice(device), "cudaSetDevice");
    }
  }
  ~DeviceGuard() {
    if (!restore_) return;
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// Puts the calling thread in relaxed stream-capture mode for the scope. In the
// default (global) mode a "potentially unsafe" call such as cudaEventQuery made
// while any other thread runs a global-mode capture fails and invalidates that
// capture (torch's NCCL watchdog met this; pytorch/pytorch PRs 105182 and
// 148594 switch the querying thread's mode, never the capturing one's).
// Querying an event recorded outside any capture is safe in fact. Make the
// device current first: the exchange initialises the runtime on the current
// device.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Errors that say "a capture is under way" (cudaErrorStreamCaptureUnsupported
// .. cudaErrorStreamCaptureWrongThread), not that the GPU or NCCL failed: a
// poller takes them as "not ready yet".
inline bool capture_error(cudaError_t e) {
  return e >= cudaErrorStreamCaptureUnsupported && e <= cudaErrorStreamCaptureWrongThread;
}

// cudaEventQuery in relaxed capture mode: true when done, false when pending
// or when a capture elsewhere keeps it from answering; throws on real errors.
// Clears the thread's last error, which "not ready" also sets.
inline bool event_done(cudaEvent_t ev, const char* what) {
  RelaxedCaptureMode relaxed;
  const cudaError_t e = cudaEventQuery(ev);
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  if (e == cudaErrorNotReady || capture_error(e)) return false;
  check(e, what);
  return false;
}

// Whether `stream` is being captured into a CUDA graph.
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace ringcomm::cuda
