#include "comm/fault_state.h"

#include <utility>

namespace ringcomm {

bool FaultRecord::set(const std::string& why, bool timeout, uint64_t finished) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!why_.empty()) return false;
  why_ = why.empty() ? std::string("unknown error") : why;
  timeout_ = timeout;
  finished_ = finished;
  return true;
}

bool FaultRecord::failed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !why_.empty();
}

std::string FaultRecord::message() const {
  std::lock_guard<std::mutex> lk(mu_);
  return why_;
}

std::string FaultRecord::error_of(uint64_t seq) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (seq == 0 || seq <= finished_) return {};
  return why_;
}

bool FaultRecord::timeout() const {
  std::lock_guard<std::mutex> lk(mu_);
  return timeout_;
}

bool AbortGate::enter() {
  std::lock_guard<std::mutex> lk(mu_);
  if (gone_ || pending_) return false;
  ++users_;
  return true;
}

void AbortGate::leave() {
  std::lock_guard<std::mutex> lk(mu_);
  if (--users_ == 0) {
    if (pending_) {
      std::function<void()> teardown = std::move(pending_);
      pending_ = nullptr;
      gone_ = true;
      teardown();
    }
    cv_.notify_all();
  }
}

void AbortGate::abort(std::function<void()> teardown) {
  std::lock_guard<std::mutex> lk(mu_);
  if (gone_ || pending_) return;
  if (users_ > 0) {
    pending_ = std::move(teardown);
    return;
  }
  gone_ = true;
  teardown();
}

void AbortGate::retire(const std::function<void()>& destroy) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return users_ == 0; });  // the last one out ran any pending abort
  if (gone_) return;
  gone_ = true;
  destroy();
}

bool AbortGate::aborted() {
  std::lock_guard<std::mutex> lk(mu_);
  return gone_ || static_cast<bool>(pending_);
}

}  // namespace ringcomm
