// Shared-memory transport between ranks of one host.
//
// Every rank owns one Segment (its inbox) and maps the inboxes of its peers.
// Sending to p writes into p's inbox; receiving from p reads this rank's own.
// A waiting rank spins on the FIFO counters (handled by the executor) and then
// sleeps on a futex "doorbell" in its own segment; a peer that publishes or
// frees a slot rings the bell only when the flag says somebody sleeps, so the
// fast path costs no system call.
//
// Failures: a peer that fails or aborts sets the abort flag of its own
// segment; one that closes its communicator sets the departure flag; one that
// dies is seen through a pidfd of its process (poll_peers, called by the
// executor while it waits). A link whose peer is gone throws as soon as this
// rank needs something from it that is not already in the FIFO, naming the
// peer, so survivors fail in milliseconds rather than at the deadline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ringcomm/types.h"
#include "transport/shm/segment.h"
#include "transport/shm/slot_stores.h"
#include "transport/transport.h"

namespace ringcomm {

class ShmLink;

class ShmTransport : public Transport {
 public:
  ShmTransport(int rank, int world, size_t slot_bytes, int nslots, SlotStoreMode stores = SlotStoreMode::kAuto);
  ~ShmTransport() override;

  // Creates this rank's inbox for `members` (the sorted ranks of this host
  // that use shared memory with it, itself included) and returns its name
  // ("" when no peer will map it). Call once, after the host census.
  std::string create_inbox(const std::vector<int>& members);
  const std::string& segment_name() const { return inbox_.name(); }
  // Maps the inbox of each member peer (names[p]; "" for this rank and for
  // peers that another transport reaches) and watches its process.
  void connect(const std::vector<std::string>& names);
  // Removes this rank's segment name from /dev/shm once every peer mapped it.
  void unlink() { inbox_.unlink(); }
  bool reaches(int peer) const;
  // How many times this rank has published its cost of reading `peer`'s
  // slots (the reader's half of the slot-store rule, ShmLink::copied_out);
  // 0 for a peer not reached over shared memory.
  uint64_t read_cost_updates(int peer) const;

  Link* link(int peer) override;
  void sleep(Clock::time_point until, const std::function<bool()>& recheck) override;
  void wake() override;
  // Probes process_vm_readv towards every mapped peer (it needs the same user
  // and ptrace permission; containers often forbid it) and remembers the answer.
  bool probe_remote_read();
  bool can_read_remote() override { return remote_read_ok_; }
  void announce_abort(const std::string& why) override;
  std::string peer_abort_reason(int peer) override;
  std::string local_abort_reason() override;
  void poll_peers() override;
  std::string peer_gone(int peer) override;
  bool any_peer_aborted() override;
  void announce_departure() override;
  void record_call(const CallRecordView& call) override;
  bool peer_call(int peer, bool p2p, CallRecordView* out) override;

  // Why `peer` can no longer take part ("" while it can): it died, closed
  // its communicator, or aborted. Checked by the links when they would wait.
  const std::string& gone_reason(int peer) const { return gone_[peer]; }
  void check_gone(int peer);
  // check_gone for a link that found nothing to do (an empty FIFO from the
  // peer, a full one to it): throws if the peer aborted; if it closed its
  // communicator or died, only when `unchanged()` still holds once that was
  // seen, for what it did before it went (the data it sent, the slots it
  // drained) is still there to be used. Returns whether the link should look
  // again (the peer went, but not before changing the FIFO).
  template <class Unchanged>
  bool check_gone(int peer, Unchanged&& unchanged) {
    try {
      check_gone(peer);
    } catch (const PeerLostError&) {
      if (peer_aborted(peer) || unchanged()) throw;
      return true;
    }
    return false;
  }
  bool peer_aborted(int peer) const;

 private:
  int rank_;
  int world_;
  size_t slot_bytes_;
  int nslots_;
  SlotStoreMode stores_;
  std::vector<int> members_;
  Segment inbox_;
  std::vector<Segment> peers_;  // indexed by rank; unmapped for this rank and non-members
  std::vector<std::unique_ptr<ShmLink>> links_;
  std::vector<const SegmentControl*> peer_controls_;  // mapped peers' controls
  std::vector<int> pidfds_;       // by rank: a pidfd of the peer's process, -1 when none
  std::vector<std::string> gone_;  // by rank: why the peer is gone
  bool remote_read_ok_ = false;
};

}  // namespace ringcomm
