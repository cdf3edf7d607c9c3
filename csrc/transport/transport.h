// A transport owns the links of one communicator and knows how to wait for
// them. comm/ selects one per communicator; algo/ never sees it.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "transport/link.h"

namespace ringcomm {

using Clock = std::chrono::steady_clock;

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

  // Whether Link::read_remote works towards every peer this transport
  // reaches (checked by a probe read at connect time).
  virtual bool can_read_remote() { return false; }

  // Interrupts a sleep() of this rank from another thread of this process
  // (new work was queued).
  virtual void wake() = 0;

  // Marks this rank as failed with `why`, so that peers waiting on it fail fast.
  virtual void announce_abort(const std::string& why) = 0;
  // Non-empty when `peer` announced an abort.
  virtual std::string peer_abort_reason(int peer) = 0;
};

}  // namespace ringcomm
