// Shared-memory transport between ranks of one host.
//
// Every rank owns one Segment (its inbox) and maps the inboxes of its peers.
// Sending to p writes into p's inbox; receiving from p reads this rank's own.
// A waiting rank spins on the FIFO counters (handled by the executor) and then
// sleeps on a futex "doorbell" in its own segment; a peer that publishes or
// frees a slot rings the bell only when the flag says somebody sleeps, so the
// fast path costs no system call.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/shm/segment.h"
#include "transport/transport.h"

namespace ringcomm {

class ShmLink;

class ShmTransport : public Transport {
 public:
  // Creates this rank's inbox; peers are attached with connect().
  ShmTransport(int rank, int world, size_t slot_bytes, int nslots);
  ~ShmTransport() override;

  const std::string& segment_name() const { return inbox_.name(); }
  // Maps the inbox of each peer (names[p]; "" for this rank and for peers
  // that another transport reaches).
  void connect(const std::vector<std::string>& names);
  // Removes this rank's segment name from /dev/shm once every peer mapped it.
  void unlink() { inbox_.unlink(); }

  Link* link(int peer) override;
  void sleep(Clock::time_point until, const std::function<bool()>& recheck) override;
  void wake() override;
  // Probes process_vm_readv towards every mapped peer (it needs the same user
  // and ptrace permission; containers often forbid it) and remembers the answer.
  bool probe_remote_read();
  bool can_read_remote() override { return remote_read_ok_; }
  void announce_abort(const std::string& why) override;
  std::string peer_abort_reason(int peer) override;

 private:
  int rank_;
  int world_;
  size_t slot_bytes_;
  int nslots_;
  Segment inbox_;
  std::vector<Segment> peers_;  // indexed by rank; empty for this rank
  std::vector<std::unique_ptr<ShmLink>> links_;
  bool remote_read_ok_ = false;
};

}  // namespace ringcomm
