// Small CUDA runtime helpers for the GPU path: error checks that throw
// ringcomm::Error, and a guard that makes a device current for a scope.
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

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Whether `stream` is being captured into a CUDA graph.
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace ringcomm::cuda
