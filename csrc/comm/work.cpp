#include "comm/work.h"

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

bool Work::is_completed() {
  std::lock_guard<std::mutex> lk(mu_);
  return state_ != State::kPending;
}

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
