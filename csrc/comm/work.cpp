#include "comm/work.h"

#include <sched.h>

#include <chrono>

#include "ringcomm/types.h"

namespace ringcomm {

void Work::complete() {
  std::lock_guard<std::mutex> lk(mu_);
  state_ = State::kDone;
  cv_.notify_all();
}

void Work::fail(ErrorKind kind, const std::string& message) {
  std::lock_guard<std::mutex> lk(mu_);
  state_ = State::kFailed;
  kind_ = kind;
  message_ = message;
  cv_.notify_all();
}

bool Work::wait(double timeout_s) {
  if (help_ && !is_completed()) help_();
  // Small operations finish within microseconds: yield for a moment before
  // blocking, since a futex wake-up costs tens of microseconds on a VM.
  auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
  while (state_.load(std::memory_order_acquire) == State::kPending &&
         std::chrono::steady_clock::now() < spin_until) {
    sched_yield();
  }
  std::unique_lock<std::mutex> lk(mu_);
  auto done = [&] { return state_ != State::kPending; };
  if (timeout_s < 0) {
    cv_.wait(lk, done);
  } else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), done)) {
    return false;
  }
  lk.unlock();
  rethrow();
  return true;
}

bool Work::is_completed() const { return state_.load(std::memory_order_acquire) != State::kPending; }

std::string Work::error_message() {
  std::lock_guard<std::mutex> lk(mu_);
  return message_;
}

Work::ErrorKind Work::error_kind() {
  std::lock_guard<std::mutex> lk(mu_);
  return kind_;
}

void Work::rethrow() {
  std::lock_guard<std::mutex> lk(mu_);
  if (state_ != State::kFailed) return;
  if (kind_ == ErrorKind::kTimeout) throw TimeoutError(message_);
  throw Error(message_);
}

}  // namespace ringcomm
