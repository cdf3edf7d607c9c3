// The GPU communicator's fault bookkeeping, kept free of CUDA so the CPU tests
// drive it (testing/bind_device_sim.cpp) on machines without a GPU.
//
// FaultRecord: which operations an error covers. After ncclCommAbort the
// kernels exit and every event completes, so "the event completed" no longer
// means "the operation succeeded". Operations carry sequence numbers (1, 2, ..
// in the order they were queued on the communicator's stream, which is also
// the order they finish in); the error remembers the highest one known to have
// finished before it, and every later one failed with it.
//
// AbortGate: the NCCL handle's lifetime against an abort from another thread
// (the watchdog, a timed-out synchronize, the user). Calls that use the handle
// enter() and leave(); abort() tears it down at once when nobody is inside and
// otherwise leaves that to the last one out, so a handle is never freed while
// a call is queuing work on it, and abort() never waits for a call to finish
// queuing. One mutex guards the handle's state; the teardown runs under it, so
// enter() after an abort always sees the handle gone.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace ringcomm {

class FaultRecord {
 public:
  // Records the first error; later ones are ignored (returns false).
  // `finished`: the highest sequence number known to have completed.
  bool set(const std::string& why, bool timeout, uint64_t finished);
  bool failed() const;
  std::string message() const;
  // The error operation `seq` failed with ("" when it did not, or when seq is
  // 0: an operation captured into a CUDA graph, which no event tracks).
  std::string error_of(uint64_t seq) const;
  bool timeout() const;

 private:
  mutable std::mutex mu_;
  std::string why_;
  bool timeout_ = false;
  uint64_t finished_ = 0;
};

class AbortGate {
 public:
  // False once the handle is aborted (or an abort waits for the users to
  // leave) or retired; the caller must not touch the handle then.
  bool enter();
  void leave();
  // Runs `teardown` once: now, or when the last user leaves. Later calls
  // (and calls after retire) do nothing.
  void abort(std::function<void()> teardown);
  // Waits for the users to leave, then runs `destroy` unless the handle was
  // aborted; enter() fails from then on.
  void retire(const std::function<void()>& destroy);
  bool aborted();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int users_ = 0;
  bool gone_ = false;  // aborted or retired: no handle any more
  std::function<void()> pending_;  // an abort waiting for the users to leave
};

}  // namespace ringcomm
