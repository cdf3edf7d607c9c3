// The handle of one issued operation. Completed by whichever thread runs it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace ringcomm {

class Work {
 public:
  enum class State { kPending, kDone, kFailed };
  enum class ErrorKind { kNone, kError, kTimeout, kMismatch, kInterrupted, kRevoked };

  // `waiters` counts the threads blocked in wait() on any Work of the
  // communicator (close() aborts rather than drains while there are some).
  explicit Work(std::string what, std::shared_ptr<std::atomic<int>> waiters = nullptr)
      : what_(std::move(what)), waiters_(std::move(waiters)) {}

  // Called by wait() first: lets the waiting thread run queued calls itself
  // (its argument: the wait has no time limit, so it may run them).
  // Set before the Work is published; only called while it is pending.
  void set_helper(std::function<void(bool)> help) { help_ = std::move(help); }
  // Called when a wait is interrupted (Ctrl-C): aborts the communicator.
  void set_on_interrupt(std::function<void(const std::string&)> f) { on_interrupt_ = std::move(f); }

  void complete();
  void fail(ErrorKind kind, const std::string& message);

  // Blocks until the operation finished or `timeout_s` (< 0: forever) passed.
  // Returns false on a wait timeout; throws the operation's error if it failed.
  bool wait(double timeout_s);
  bool is_completed() const;
  // Empty unless the operation failed.
  std::string error_message();
  ErrorKind error_kind();
  const std::string& what() const { return what_; }
  // A recv: the rank its message came from (set before it completes); -1 otherwise.
  void set_source(int rank) { source_.store(rank, std::memory_order_relaxed); }
  int source() const { return source_.load(std::memory_order_relaxed); }
  // Throws the stored error (Error, TimeoutError, MismatchError) if the operation failed.
  void rethrow();

 private:
  std::string what_;
  std::shared_ptr<std::atomic<int>> waiters_;
  std::function<void(bool)> help_;
  std::function<void(const std::string&)> on_interrupt_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<State> state_{State::kPending};
  std::atomic<int> sleepers_{0};  // threads in wait()'s blocking part (complete() notifies only then)
  ErrorKind kind_ = ErrorKind::kNone;
  std::atomic<int> source_{-1};
  std::string message_;
};

}  // namespace ringcomm
