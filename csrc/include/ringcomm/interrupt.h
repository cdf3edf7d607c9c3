// Ctrl-C during blocking waits: the Python bindings install, for the thread
// that runs Python's signal handlers, a check that says whether a signal
// handler raised (KeyboardInterrupt). Every wait of the core that may block
// for long calls check_interrupted now and then; it throws Interrupted, and
// the bindings then raise the pending Python exception. Other threads (the
// worker, the TCP I/O thread) have no check and never stop for it.
#pragma once

#include <chrono>
#include <string>

#include "ringcomm/types.h"

namespace ringcomm {

using InterruptCheck = bool (*)();

inline InterruptCheck& interrupt_check_slot() {
  static thread_local InterruptCheck check = nullptr;
  return check;
}
inline InterruptCheck interrupt_check() { return interrupt_check_slot(); }
inline void set_interrupt_check(InterruptCheck check) { interrupt_check_slot() = check; }

// How often a waiting thread asks (each ask takes the GIL for a moment).
constexpr std::chrono::milliseconds kInterruptPoll{20};

// Throws Interrupted when the calling thread's check says so, at most every
// kInterruptPoll (tracked in *last); `what()` names the wait for the message
// (called only then: waits call this in their loops).
template <class What>
inline void check_interrupted(std::chrono::steady_clock::time_point now,
                              std::chrono::steady_clock::time_point* last, const What& what) {
  InterruptCheck check = interrupt_check();
  if (!check || now - *last < kInterruptPoll) return;
  *last = now;
  if (check()) {
    throw Interrupted("ringcomm: " + std::string(what()) + " was interrupted (KeyboardInterrupt); the communicator is aborted");
  }
}

}  // namespace ringcomm
