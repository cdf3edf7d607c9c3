// Point-to-point matching: send/recv with tags and receives from any source.
// The design is described at the top of comm/p2p_match.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "comm/call_check.h"  // kAnySource
#include "ringcomm/types.h"
#include "transport/transport.h"

namespace ringcomm {

// One posted send or receive. Owned by the matcher (a pool: no allocation
// per call once warm); the communicator holds it from post to finish().
struct P2pOp {
  bool is_send = false;
  int peer = -1;       // dst, src, or kAnySource
  int64_t tag = 0;     // the user's tag
  char* buf = nullptr;
  size_t nbytes = 0;
  uint8_t dtype = 0;
  uint64_t count = 0;
  uint64_t seq = 0;    // send: the message number on its pair; recv: the call's number (for messages)
  // Progress.
  bool matched = false;   // recv: bound to a message (source, header known)
  bool complete = false;
  bool pull = false;      // send: travels as an address the receiver reads (single copy)
  bool announced = false;  // send, pull: its address was sent
  int source = -1;        // recv: the rank whose message it got
  int64_t got_tag = 0;    // recv: that message's tag
  size_t done = 0;        // bytes moved
  uint64_t segment = 0;   // segments moved
  uint64_t ticket = 0;    // send: its last segment sent by reference (Link::send_ref), 0: none
  uint64_t order = 0;     // post order (matching takes the oldest posted receive)
  bool in_use = false;
};

class P2pMatcher {
 public:
  // `unexpected_cap`: bytes of unmatched messages this rank holds, all peers together.
  P2pMatcher(int rank, int world, Transport* transport, size_t unexpected_cap);

  // Whether sends of at least `min_bytes` may travel by pull (single copy;
  // every rank must decide alike: set from the communicator's agreement).
  void set_pull(bool on, size_t min_bytes) {
    pull_ = on;
    pull_min_ = min_bytes;
  }

  P2pOp* post_send(char* buf, size_t nbytes, uint8_t dtype, uint64_t count, int dst, int64_t tag, uint64_t seq);
  // May match (and complete) at once from the messages already held.
  P2pOp* post_recv(char* buf, size_t nbytes, uint8_t dtype, uint64_t count, int src, int64_t tag, uint64_t seq);
  // Moves every posted operation as far as the links allow; returns whether
  // anything moved. Throws MismatchError for a matched send and receive of
  // different sizes, Error for a malformed stream.
  bool progress();
  // A collective found peer p's message at the head of p's FIFO (p sent
  // it before this collective, its recv comes later): moves what has
  // arrived of it (and of the messages after it) into the held messages.
  // Returns whether anything moved (false: nothing more has arrived, or the
  // limit on held messages is reached).
  bool absorb(int p) { return pull_receive(p, peers_[p], true); }
  // Returns an operation (complete or abandoned after an error) to the pool.
  void finish(P2pOp* op);
  // After an error: every operation is dropped (the communicator is poisoned).
  void reset();

  // What a timed-out operation waited for, with what is held from the peers.
  std::string waiting_text(const P2pOp& op);
  // The peers whose next message waits for room under the limit on held
  // messages, in words ("" when none): part of waiting_text, and added to
  // the error of a call that fails for another reason meanwhile (a peer that
  // aborted, typically the sender whose send timed out behind that message).
  std::string limit_text() const;

 private:
  struct Held {  // a message that arrived before its receive was posted
    int64_t tag = 0;
    uint8_t dtype = 0;
    uint64_t count = 0;
    uint64_t seq = 0;
    size_t nbytes = 0;
    std::vector<char> data;  // the bytes received so far
    bool complete = false;
    uint64_t arrival = 0;
  };
  struct Peer {
    std::vector<P2pOp*> sends;  // in issue order; the first one streams
    size_t send_head = 0;
    P2pOp* pull_pending = nullptr;  // a pull send awaiting its acknowledgement
    std::list<Held> held;           // arrival order
    // The message whose segments are arriving: into `in_op` or `in_held`.
    bool in_active = false;
    P2pOp* in_op = nullptr;
    Held* in_held = nullptr;
    uint64_t in_seq = 0;       // the sender's message number
    uint64_t in_segment = 0;   // the next segment expected
    size_t in_total = 0, in_done = 0;
    MsgTag in_tag;             // the header every segment of the message carries
    bool in_posted = false;    // the rest of in_op's message is posted to land in place (Link::post_recv)
    size_t in_landed = 0;      // ... and this much of it has
    uint64_t last_seq = 0;     // the last message number seen from this peer
    int named = 0;             // posted receives naming this peer, unmatched
    bool blocked = false;      // the head did not fit under the cap
  };

  bool push_sends(int p, Peer& peer);
  bool pull_receive(int p, Peer& peer, bool hold_all = false);
  void end_message(Peer& peer);  // the message streaming in from `peer` is complete
  P2pOp* match_posted(int p, int64_t tag);
  void check_sizes(const P2pOp& op, int src, uint8_t dtype, uint64_t count, int64_t tag) const;
  void take_held(P2pOp& op, int p, Peer& peer, std::list<Held>::iterator it);
  void pull_into(P2pOp& op, int p, uint64_t addr, uint64_t seq);
  void unpost(P2pOp* op);
  P2pOp* alloc();

  const int rank_;
  const int world_;
  Transport* transport_;
  const size_t cap_;
  bool pull_ = false;
  size_t pull_min_ = SIZE_MAX;
  std::vector<Peer> peers_;
  std::vector<P2pOp*> posted_;   // unmatched receives, in post order
  int any_posted_ = 0;           // ... of which from any source
  std::vector<int> sending_;     // peers with queued sends
  std::vector<int> streaming_;   // peers with a message arriving
  std::vector<std::unique_ptr<P2pOp>> pool_;
  std::vector<P2pOp*> free_;
  size_t held_bytes_ = 0;
  uint64_t arrivals_ = 0;
  uint64_t posts_ = 0;
  int next_any_ = 0;  // any-source receives look at the peers round robin from here
};

}  // namespace ringcomm
