#include "comm/cuda/gpu_work.h"

#include <chrono>
#include <thread>

#include "common/cuda/cuda_util.h"
#include "comm/cuda/gpu_communicator.h"

namespace ringcomm {

GpuWork::GpuWork(std::shared_ptr<GpuCommunicator> owner, int device, cudaEvent_t done, bool captured, uint64_t seq,
                 std::string what)
    : owner_(std::move(owner)),
      device_(device),
      done_(done),
      captured_(captured),
      seq_(captured ? 0 : seq),
      what_(std::move(what)) {}

GpuWork::~GpuWork() {
  if (done_) cudaEventDestroy(done_);
}

std::string GpuWork::error() const { return owner_->error_of(seq_); }

bool GpuWork::error_is_timeout() const { return !error().empty() && owner_->error_is_timeout(); }

void GpuWork::raise(const std::string& why) const {
  const std::string msg = "ringcomm: " + what_ + " on rank " + std::to_string(owner_->rank()) + " failed: " + why;
  if (owner_->error_is_timeout()) throw TimeoutError(msg);
  throw Error(msg);
}

void GpuWork::wait_stream(cudaStream_t stream) {
  if (captured_) return;
  const std::string err = error();
  if (!err.empty()) raise(err);
  cuda::DeviceGuard g(device_);
  cuda::check(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");
}

bool GpuWork::is_completed() {
  if (captured_) return true;
  cuda::DeviceGuard g(device_);  // before the capture-mode exchange (it initialises the current device)
  return cuda::event_done(done_, "cudaEventQuery");
}

bool GpuWork::wait_host(double timeout_s) {
  if (captured_) return true;
  if (timeout_s < 0) timeout_s = owner_->timeout_s();
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  // Poll: a blocking cudaEventSynchronize would never return if a peer died
  // (NCCL kernels spin forever); NCCL's async error and the deadline are
  // looked at between polls.
  auto pause = std::chrono::microseconds(2);
  for (;;) {
    const bool done = is_completed();
    std::string err = error();
    if (!err.empty()) raise(err);
    if (done) return true;
    err = owner_->async_error();  // NCCL's own error: fails the communicator, so error() has it next time
    if (!err.empty()) {
      owner_->fail("NCCL: " + err, false);
      err = error();
      if (!err.empty()) raise(err);
    }
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(1000)) pause *= 2;
  }
}

void GpuWork::synchronize(double timeout_s) {
  if (timeout_s < 0) timeout_s = owner_->timeout_s();
  if (wait_host(timeout_s)) return;
  const std::string secs = seconds_text(timeout_s);
  owner_->fail(what_ + " timed out after " + secs + " s on the GPU", true);
  throw TimeoutError("ringcomm: " + what_ + " on rank " + std::to_string(owner_->rank()) + ": Timed out after " +
                     secs + " s on the GPU (did every rank call it?); the NCCL communicator was aborted");
}

}  // namespace ringcomm
