#include "comm/work.h"

#include <sched.h>

#include <chrono>

#include "comm/executor.h"
#include "ringcomm/types.h"

namespace ringcomm {

// Most calls are completed by the thread that waits for them (it ran the
// call, Communicator::help) or while it spins: only a thread asleep on cv_
// needs the lock and the notify. sleepers_ and state_ are both seq_cst: a
// waiter either sees kDone before it sleeps, or is counted here (and the lock
// is taken only once it is inside cv_.wait).
void Work::complete() {
  state_.store(State::kDone, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  { std::lock_guard<std::mutex> lk(mu_); }
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
  struct Waiting {
    std::atomic<int>* n;
    explicit Waiting(std::atomic<int>* c) : n(c) {
      if (n) n->fetch_add(1);
    }
    ~Waiting() {
      if (n) n->fetch_sub(1);
    }
  } waiting(waiters_.get());
  // A wait without a limit may run the call itself; a timed one leaves it to
  // the worker (a call run here would hold this thread past the limit).
  if (help_ && !is_completed()) help_(timeout_s < 0);
  // Most small calls are done by now (this thread ran them): no clock, no lock.
  if (state_.load(std::memory_order_acquire) == State::kDone) return true;
  // Small operations finish within microseconds: yield for a moment before
  // blocking, since a futex wake-up costs tens of microseconds on a VM.
  const auto start = std::chrono::steady_clock::now();
  auto spin_until = start + std::chrono::microseconds(200);
  while (state_.load(std::memory_order_acquire) == State::kPending &&
         std::chrono::steady_clock::now() < spin_until) {
    sched_yield();
  }
  std::unique_lock<std::mutex> lk(mu_);
  struct Sleeping {
    std::atomic<int>& n;
    explicit Sleeping(std::atomic<int>& c) : n(c) { n.fetch_add(1, std::memory_order_seq_cst); }
    ~Sleeping() { n.fetch_sub(1, std::memory_order_seq_cst); }
  } sleeping(sleepers_);
  auto done = [&] { return state_.load(std::memory_order_seq_cst) != State::kPending; };
  // Wait in slices so that Ctrl-C is seen (interrupt_check) within ~20 ms.
  const bool forever = timeout_s < 0;
  const auto until = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(forever ? 0.0 : timeout_s));
  Clock::time_point last_check{};
  while (!done()) {
    auto now = std::chrono::steady_clock::now();
    if (!forever && now >= until) return false;
    auto slice = std::chrono::steady_clock::duration(kInterruptPoll);
    if (!forever) slice = std::min(slice, until - now);
    cv_.wait_for(lk, slice, done);
    if (!done() && interrupt_check()) {
      lk.unlock();
      try {
        check_interrupted(Clock::now(), &last_check, [&] { return "the wait for " + what_; });
      } catch (const Interrupted& e) {
        if (on_interrupt_) on_interrupt_(e.what());
        throw;
      }
      lk.lock();
    }
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
  if (state_.load(std::memory_order_acquire) != State::kFailed) return;  // (set once, under mu_)
  std::lock_guard<std::mutex> lk(mu_);
  switch (kind_) {
    case ErrorKind::kTimeout: throw TimeoutError(message_);
    case ErrorKind::kMismatch: throw MismatchError(message_);
    case ErrorKind::kInterrupted: throw Interrupted(message_);
    case ErrorKind::kRevoked: throw RevokedError(message_);
    default: throw Error(message_);
  }
}

}  // namespace ringcomm
