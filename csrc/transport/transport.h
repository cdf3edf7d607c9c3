// A transport owns the links of one communicator and knows how to wait for
// them. comm/ selects one per communicator; algo/ never sees it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "transport/link.h"

namespace ringcomm {

using Clock = std::chrono::steady_clock;

enum class CallState : uint8_t { kNone = 0, kIssued = 1, kRunning = 2, kFinished = 3, kFailed = 4 };

// A rank's last call as peers see it (timeout messages): OpKind, sequence
// number, CallState, and for point-to-point calls the peer.
struct CallRecordView {
  uint8_t kind = 0;
  uint8_t state = 0;
  uint8_t p2p = 0;  // 0: a collective; 1: a send to `peer`; 2: a receive from `peer`
  int peer = -1;
  uint64_t seq = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // The link to `peer` (never this rank).
  virtual Link* link(int peer) = 0;

  // Blocks until a peer may have changed one of this rank's FIFOs, or until
  // `until`. `recheck` runs after this rank has announced that it is going to
  // sleep, so a signal sent meanwhile is never lost; when it returns true
  // (progress was made) the sleep is skipped.
  virtual void sleep(Clock::time_point until, const std::function<bool()>& recheck) = 0;

  // A call stops early (an error): every segment still queued by reference
  // (Link::send_ref) is copied into the transport's own slots, so nothing
  // reads the caller's memory once the call has returned. Safe from the
  // executor's thread while the transport's threads run.
  virtual void release_refs() {}

  // Whether Link::read_remote works towards every peer this transport
  // reaches (checked by a probe read at connect time).
  virtual bool can_read_remote() { return false; }

  // Interrupts a sleep() of this rank from another thread of this process
  // (new work was queued, or the communicator is being aborted).
  virtual void wake() = 0;

  // Marks this rank as failed with `why`, so that peers waiting on it fail fast.
  virtual void announce_abort(const std::string& why) = 0;
  // Non-empty when `peer` announced an abort.
  virtual std::string peer_abort_reason(int peer) = 0;
  // Whether some peer announced an abort (a cheap look, made at the start of
  // every call: a call must not succeed with peers that already failed).
  virtual bool any_peer_aborted() { return false; }
  // Non-empty once this rank announced an abort (another thread's abort()
  // must stop a call blocked in this one).
  virtual std::string local_abort_reason() { return {}; }
  // Why `peer` is known to be gone (its process died, it closed its
  // communicator, its connection broke), or "" (alive, or not known). Safe
  // from any thread, also while a call runs; never throws. Only positive
  // evidence counts: a peer that is merely slow (stopped) is not gone.
  virtual std::string peer_gone(int /*peer*/) { return {}; }
  // Looks at whether the peers' processes still live (a system call or so;
  // the executor calls it every few milliseconds while it waits).
  virtual void poll_peers() {}
  // Tells the peers this rank closed its communicator in order.
  virtual void announce_departure() {}
  // Publishes this rank's last call / reads a peer's last collective or last
  // point-to-point call (false when unknown).
  virtual void record_call(const CallRecordView&) {}
  // Asks every peer this transport reaches for its last calls at once (the
  // answers are then read with peer_call), for a timeout message.
  virtual void request_peer_calls() {}
  virtual bool peer_call(int, bool /*p2p*/, CallRecordView*) { return false; }
};

}  // namespace ringcomm
