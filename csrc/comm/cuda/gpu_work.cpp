#include "comm/cuda/gpu_work.h"

#include <chrono>
#include <thread>

#include "comm/cuda/cuda_util.h"
#include "comm/cuda/gpu_communicator.h"

namespace ringcomm {

GpuWork::GpuWork(std::shared_ptr<GpuCommunicator> owner, int device, cudaEvent_t done, bool captured,
                 std::string what)
    : owner_(std::move(owner)), device_(device), done_(done), captured_(captured), what_(std::move(what)) {}

GpuWork::~GpuWork() {
  if (done_) cudaEventDestroy(done_);
}

void GpuWork::wait_stream(cudaStream_t stream) {
  if (captured_) return;
  cuda::DeviceGuard g(device_);
  cuda::check(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");
}

bool GpuWork::is_completed() {
  if (captured_) return true;
  cuda::DeviceGuard g(device_);
  cudaError_t e = cudaEventQuery(done_);
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // the runtime also records "not ready" as this thread's last error
    return false;
  }
  cuda::check(e, "cudaEventQuery");
  return false;
}

void GpuWork::synchronize(double timeout_s) {
  if (captured_) return;
  if (timeout_s < 0) timeout_s = owner_->timeout_s();
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  // Poll: a blocking cudaEventSynchronize would never return if a peer died
  // (NCCL kernels spin forever); NCCL's async error and the deadline are
  // looked at between polls.
  auto pause = std::chrono::microseconds(2);
  for (;;) {
    if (is_completed()) return;
    std::string err = owner_->async_error();
    if (!err.empty()) {
      owner_->abort(err);
      throw Error("ringcomm: " + what_ + " on rank " + std::to_string(owner_->rank()) + " failed: " + err);
    }
    if (Clock::now() > deadline) {
      const std::string secs = seconds_text(timeout_s);
      const std::string why = what_ + " timed out after " + secs + " s on the GPU";
      owner_->abort(why);
      throw TimeoutError("ringcomm: " + what_ + " on rank " + std::to_string(owner_->rank()) +
                         " timed out after " + secs +
                         " s on the GPU (did every rank call it?); the NCCL communicator was aborted");
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(1000)) pause *= 2;
  }
}

}  // namespace ringcomm
