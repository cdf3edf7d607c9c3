// Point-to-point matching (MPI / gloo semantics): send(buf, dst, tag) and
// recv(buf, src, tag) with src a rank or any source.
//
// Wire. Every message from a rank to a peer travels in that pair's FIFO (the
// Link), whole and in the sender's issue order, as segments whose MsgHeader
// names it: kind kSend, the sender's message number on the pair (`seq`,
// consecutive), dtype, count, the user's tag (`p2p_tag`) and the segment
// index. Small and mid-sized messages are eager: the payload follows in the
// segments. A large one where the ranks can read each other's memory
// (pull, size >= pull_min_bytes) sends one 8-byte segment, its buffer's
// address: the receiver reads it straight into the matching receive (or,
// when none is posted yet, into held memory, below) and acknowledges the
// message number through the pair's `pulled` counter. A rank has at most one
// pull send waiting per peer (so that "the highest acknowledged number"
// says which one was read); a second large send to that peer meanwhile goes
// eager. The sender decides the form; the receiver follows the header, so
// ranks need not agree on it.
//
// Matching. A receive takes the oldest message from its source (any source:
// from any peer) with its tag; the messages of one source and tag are never
// overtaken, messages of different tags may be received in any order. A
// message whose first segment arrives is matched against the posted
// receives in post order; a receive being posted first looks at the
// messages held (below), oldest first (any source: lowest arrival number).
// Size and dtype must agree between a send and its receive: a difference is
// a MismatchError on the receiver, which poisons the communicator and tells
// the peers (the sender's next call or wait raises).
//
// Unexpected messages. While a receive waits, the matcher reads the FIFOs
// it may be matched from (its source, or every peer) and moves messages
// nobody has posted a receive for yet out of the way, into `held` (per
// peer, in arrival order; a pull message is read at once into held memory
// and acknowledged, so its sender never waits for a receive posted later).
// The FIFO is never blocked by a message of another tag, so no receive
// order deadlocks while the held bytes stay under the cap,
// Config::p2p_unexpected_bytes (RINGCOMM_P2P_UNEXPECTED_MB, default
// 256 MiB), for all peers together, counting 64 bytes per held message
// besides its payload. A message that does not fit stays in the
// FIFO (its sender then waits once the FIFO is full) and a receive that
// needs what lies behind it times out naming the limit. Held messages live
// as long as the communicator; a message is held at most until its receive
// is posted, which copies it out (one extra copy, only for messages that
// came before their receive and could not go straight into it).
//
// The matcher only reads p2p segments: a collective's segment at the head
// of a FIFO (a peer that went on to the next collective) stays there. The
// other way round, a collective that finds a p2p message at the head of a
// FIFO (the peer sent it before the collective; this rank receives it
// after) hands it to the matcher (absorb), which holds it: as on gloo, a
// message may wait across collectives for its recv. No receive is posted
// while a collective runs (send/recv groups end before collectives start).
#include "comm/p2p_match.h"

#include <algorithm>
#include <cstring>

#include "algo/schedules.h"
#include "comm/describe.h"
#include "ringcomm/copy.h"

namespace ringcomm {
namespace {

constexpr size_t kHeldOverhead = 64;

std::string num(uint64_t v) { return std::to_string(v); }

std::string tag_text(int64_t tag) { return "tag " + std::to_string(tag); }

}  // namespace

P2pMatcher::P2pMatcher(int rank, int world, Transport* transport, size_t unexpected_cap)
    : rank_(rank), world_(world), transport_(transport), cap_(unexpected_cap), peers_(world) {
  posted_.reserve(64);
  free_.reserve(64);
}

P2pOp* P2pMatcher::alloc() {
  if (free_.empty()) {
    pool_.push_back(std::make_unique<P2pOp>());
    free_.push_back(pool_.back().get());
  }
  P2pOp* op = free_.back();
  free_.pop_back();
  *op = P2pOp{};
  op->in_use = true;
  return op;
}

void P2pMatcher::finish(P2pOp* op) {
  if (!op || !op->in_use) return;
  op->in_use = false;
  free_.push_back(op);
}

void P2pMatcher::reset() {
  for (Peer& p : peers_) {
    p.sends.clear();
    p.send_head = 0;
    p.pull_pending = nullptr;
    p.in_op = nullptr;
    p.in_posted = false;  // the communicator cancelled the post (Transport::release_refs)
    if (p.in_active && !p.in_held) p.in_active = false;  // its receive is gone: the stream cannot go on
    p.named = 0;
  }
  posted_.clear();
  any_posted_ = 0;
}

P2pOp* P2pMatcher::post_send(char* buf, size_t nbytes, uint8_t dtype, uint64_t count, int dst, int64_t tag,
                             uint64_t seq) {
  P2pOp* op = alloc();
  op->is_send = true;
  op->peer = dst;
  op->tag = tag;
  op->buf = buf;
  op->nbytes = nbytes;
  op->dtype = dtype;
  op->count = count;
  op->seq = seq;
  op->order = ++posts_;
  peers_[dst].sends.push_back(op);
  return op;
}

P2pOp* P2pMatcher::post_recv(char* buf, size_t nbytes, uint8_t dtype, uint64_t count, int src, int64_t tag,
                             uint64_t seq) {
  P2pOp* op = alloc();
  op->peer = src;
  op->tag = tag;
  op->buf = buf;
  op->nbytes = nbytes;
  op->dtype = dtype;
  op->count = count;
  op->seq = seq;
  op->order = ++posts_;
  // A held message is older than anything still in the FIFOs.
  if (src != kAnySource) {
    Peer& peer = peers_[src];
    for (auto it = peer.held.begin(); it != peer.held.end(); ++it) {
      if (it->tag == tag) {
        take_held(*op, src, peer, it);
        return op;
      }
    }
  } else {
    int best = -1;
    std::list<Held>::iterator best_it;
    for (int q = 0; q < world_; ++q) {
      for (auto it = peers_[q].held.begin(); it != peers_[q].held.end(); ++it) {
        if (it->tag != tag) continue;
        if (best < 0 || it->arrival < best_it->arrival) {
          best = q;
          best_it = it;
        }
        break;  // the first of a peer is its oldest
      }
    }
    if (best >= 0) {
      take_held(*op, best, peers_[best], best_it);
      return op;
    }
  }
  posted_.push_back(op);
  if (src == kAnySource) {
    ++any_posted_;
  } else {
    ++peers_[src].named;
  }
  return op;
}

void P2pMatcher::unpost(P2pOp* op) {
  auto it = std::find(posted_.begin(), posted_.end(), op);
  if (it == posted_.end()) return;
  posted_.erase(it);
  if (op->peer == kAnySource) {
    --any_posted_;
  } else {
    --peers_[op->peer].named;
  }
}

P2pOp* P2pMatcher::match_posted(int p, int64_t tag) {
  for (P2pOp* op : posted_) {
    if ((op->peer == p || op->peer == kAnySource) && op->tag == tag) {
      unpost(op);
      return op;
    }
  }
  return nullptr;
}

void P2pMatcher::check_sizes(const P2pOp& op, int src, uint8_t dtype, uint64_t count, int64_t tag) const {
  if (op.dtype == dtype && op.count == count) return;
  const std::string sent = num(count) + " elements of " +
                           (dtype < kNumDataTypes ? dtype_name(static_cast<DataType>(dtype)) : "?");
  const std::string want = num(op.count) + " elements of " + dtype_name(static_cast<DataType>(op.dtype));
  throw MismatchError("ringcomm: mismatched calls: recv " +
                      std::string(op.peer == kAnySource ? "from any rank" : "from rank " + num(src)) + " (" +
                      tag_text(tag) + ") on rank " + num(rank_) + " of " + want + " (" + num(op.nbytes) +
                      " bytes) matched a send of rank " + num(src) + " of " + sent + "; a send and the recv it "
                      "matches must have the same size and dtype");
}

void P2pMatcher::pull_into(P2pOp& op, int p, uint64_t addr, uint64_t seq) {
  Link* link = transport_->link(p);
  if (op.nbytes) link->read_remote(op.buf, addr, op.nbytes);
  link->ack_pull(seq);
  op.done = op.nbytes;
  op.complete = true;
}

void P2pMatcher::take_held(P2pOp& op, int p, Peer& peer, std::list<Held>::iterator it) {
  check_sizes(op, p, it->dtype, it->count, it->tag);
  op.matched = true;
  op.source = p;
  op.got_tag = it->tag;
  {
    const bool arriving = peer.in_active && peer.in_held == &*it;
    const size_t have = arriving ? peer.in_done : it->nbytes;
    if (have) std::memcpy(op.buf, it->data.data(), have);
    op.done = have;
    if (arriving) {
      peer.in_op = &op;  // the rest goes straight into the receive
      peer.in_held = nullptr;
    } else {
      op.complete = true;
    }
  }
  held_bytes_ -= it->nbytes + kHeldOverhead;
  peer.held.erase(it);
  for (Peer& q : peers_) q.blocked = false;
}

bool P2pMatcher::push_sends(int p, Peer& peer) {
  Link* link = transport_->link(p);
  bool moved = false;
  if (peer.pull_pending && link->pulled() >= peer.pull_pending->seq) {
    peer.pull_pending->done = peer.pull_pending->nbytes;
    peer.pull_pending->complete = true;
    peer.pull_pending = nullptr;
    moved = true;
  }
  while (peer.send_head < peer.sends.size()) {
    P2pOp* op = peer.sends[peer.send_head];
    MsgHeader h;
    h.tag.kind = static_cast<uint8_t>(OpKind::kSend);
    h.tag.dtype = op->dtype;
    h.tag.redop = 0xff;
    h.tag.seq = op->seq;
    h.tag.count = op->count;
    h.tag.p2p_tag = op->tag;
    if (op->segment == 0 && pull_ && op->nbytes >= pull_min_ && !peer.pull_pending) op->pull = true;
    if (op->pull) {
      char* slot = link->send_slot(0, sizeof(uint64_t));
      if (!slot) return moved;
      const uint64_t addr = reinterpret_cast<uint64_t>(op->buf);
      std::memcpy(slot, &addr, sizeof addr);
      h.tag.algo = kFamilyPull;
      h.nbytes = sizeof addr;
      h.segment = 0;
      link->send_commit(h);
      op->announced = true;
      op->segment = 1;
      peer.pull_pending = op;
      ++peer.send_head;
      moved = true;
      continue;
    }
    h.tag.algo = kFamilyFifo;
    const size_t slot_bytes = link->slot_bytes();
    // Large segments leave from the user's buffer (Link::send_ref); the send
    // is complete once the link no longer reads it.
    const size_t ref_min = link->ref_min_bytes();
    while (!op->complete) {
      if (op->ticket && op->done == op->nbytes) {
        if (!link->sent(op->ticket)) return moved;
        op->complete = true;
        moved = true;
        break;
      }
      const size_t n = std::min(slot_bytes, op->nbytes - op->done);
      char* slot = link->send_slot(page_offset(op->buf + op->done), n);
      if (!slot) return moved;
      h.nbytes = static_cast<uint32_t>(n);
      h.segment = op->segment;
      if (const uint64_t t = link->send_from(slot, op->buf + op->done, h, ref_min)) op->ticket = t;
      op->done += n;
      ++op->segment;
      moved = true;
      if (op->done == op->nbytes && !op->ticket) op->complete = true;
    }
    ++peer.send_head;
  }
  peer.sends.clear();
  peer.send_head = 0;
  return moved;
}

bool P2pMatcher::pull_receive(int p, Peer& peer, bool hold_all) {
  Link* link = transport_->link(p);
  bool moved = false;
  // Only while a receive may want what comes next: a peer that closed after
  // its last message must not fail a rank that has all it needs.
  while (hold_all || peer.in_active || peer.named > 0 || any_posted_ > 0) {
    // A matched receive's large segments land in its buffer (Link::post_recv).
    if (peer.in_posted) {
      bool over = false;
      if (link->take_landed(link->slot_bytes(), &peer.in_landed, &peer.in_done, &peer.in_segment, &over)) {
        peer.in_op->done = peer.in_done;
        moved = true;
      }
      if (!over) return moved;
      peer.in_posted = false;
      if (peer.in_done == peer.in_total) {
        end_message(peer);
        continue;
      }
    } else if (peer.in_active && peer.in_op &&
               std::min(link->slot_bytes(), peer.in_total - peer.in_done) >= link->post_min_bytes() &&
               link->post_recv(peer.in_op->buf + peer.in_done, peer.in_total - peer.in_done, peer.in_tag,
                               peer.in_segment, link->slot_bytes())) {
      peer.in_posted = true;
      peer.in_landed = 0;
      continue;
    }
    const char* payload = nullptr;
    const MsgHeader* h = link->recv_peek(&payload);
    if (!h || h->tag.kind != static_cast<uint8_t>(OpKind::kSend)) return moved;  // nothing, or a collective's
    const MsgTag& t = h->tag;
    if (!peer.in_active) {
      if (h->segment != 0 || t.seq != peer.last_seq + 1 || t.dtype >= kNumDataTypes) {
        throw Error("ringcomm: rank " + num(rank_) + " got a malformed message from rank " + num(p) + ": " +
                    describe_tag(t) + " segment " + num(h->segment) + ", expected the start of message " +
                    num(peer.last_seq + 1));
      }
      const bool is_pull = t.algo == kFamilyPull;
      const size_t total = t.count * dtype_size(static_cast<DataType>(t.dtype));
      if (is_pull && h->nbytes != sizeof(uint64_t)) {
        throw Error("ringcomm: rank " + num(rank_) + " got a malformed pull message from rank " + num(p));
      }
      if (is_pull && !pull_) {
        // The sender believes this rank can read its memory; this rank
        // agreed otherwise (its link to the sender may be TCP).
        throw Error("ringcomm: rank " + num(rank_) + " got a message in pull form (an address in rank " + num(p) +
                    "'s memory) from rank " + num(p) + " (" + tag_text(t.p2p_tag) + "), but single-copy receives "
                    "are off on this rank: it cannot read rank " + num(p) + "'s memory over its link to it. "
                    "Ranks " + num(p) + " and " + num(rank_) + " disagree on whether sends may pull (set_pull)");
      }
      P2pOp* op = match_posted(p, t.p2p_tag);
      if (op) {
        check_sizes(*op, p, t.dtype, t.count, t.p2p_tag);
        op->matched = true;
        op->source = p;
        op->got_tag = t.p2p_tag;
        if (is_pull) {
          uint64_t addr;
          std::memcpy(&addr, payload, sizeof addr);
          const uint64_t seq = t.seq;
          link->recv_release();
          peer.last_seq = seq;
          pull_into(*op, p, addr, seq);
          moved = true;
          continue;
        }
        peer.in_op = op;
        peer.in_held = nullptr;
      } else {
        const size_t cost = total + kHeldOverhead;
        if (cost > cap_ - std::min(cap_, held_bytes_)) {
          peer.blocked = true;
          return moved;
        }
        peer.held.emplace_back();
        Held& m = peer.held.back();
        m.tag = t.p2p_tag;
        m.dtype = t.dtype;
        m.count = t.count;
        m.seq = t.seq;
        m.nbytes = total;
        m.arrival = ++arrivals_;
        held_bytes_ += cost;
        m.data.resize(total);
        if (is_pull) {
          // Read now, not when its recv comes: the sender waits for the
          // acknowledgement, perhaps before a call the recv comes after.
          uint64_t addr;
          std::memcpy(&addr, payload, sizeof addr);
          link->recv_release();
          if (total) link->read_remote(m.data.data(), addr, total);
          link->ack_pull(t.seq);
          m.complete = true;
          peer.last_seq = t.seq;
          moved = true;
          continue;
        }
        peer.in_op = nullptr;
        peer.in_held = &m;
      }
      peer.in_active = true;
      peer.in_tag = t;
      peer.in_seq = t.seq;
      peer.in_segment = 0;
      peer.in_total = total;
      peer.in_done = 0;
      peer.last_seq = t.seq;
    } else if (t.seq != peer.in_seq || h->segment != peer.in_segment) {
      throw Error("ringcomm: rank " + num(rank_) + " got segment " + num(h->segment) + " of message " + num(t.seq) +
                  " from rank " + num(p) + ", expected segment " + num(peer.in_segment) + " of message " +
                  num(peer.in_seq));
    }
    const size_t n = h->nbytes;
    if (n > peer.in_total - peer.in_done || (n == 0 && peer.in_total != 0)) {
      throw Error("ringcomm: rank " + num(rank_) + " got a segment of " + num(n) + " bytes from rank " + num(p) +
                  " where message " + num(peer.in_seq) + " has " + num(peer.in_total - peer.in_done) + " bytes left");
    }
    char* dst = peer.in_op ? peer.in_op->buf + peer.in_done : peer.in_held->data.data() + peer.in_done;
    link->copy_out(dst, payload, n, peer.in_total >= kStreamingCopyMinBytes && peer.in_op);
    link->recv_release();
    peer.in_done += n;
    ++peer.in_segment;
    if (peer.in_op) peer.in_op->done = peer.in_done;
    moved = true;
    if (peer.in_done == peer.in_total) end_message(peer);
  }
  return moved;
}

void P2pMatcher::end_message(Peer& peer) {
  if (peer.in_op) {
    peer.in_op->complete = true;
  } else {
    peer.in_held->complete = true;
  }
  peer.in_active = false;
  peer.in_op = nullptr;
  peer.in_held = nullptr;
}

bool P2pMatcher::progress() {
  bool moved = false;
  for (int p = 0; p < world_; ++p) {
    Peer& peer = peers_[p];
    if (p != rank_ && (peer.send_head < peer.sends.size() || peer.pull_pending)) moved |= push_sends(p, peer);
  }
  if (any_posted_ > 0) {
    // Every peer, starting at a different one each time (no peer is favoured).
    const int start = next_any_;
    next_any_ = (next_any_ + 1) % world_;
    int closed = 0;
    for (int i = 0; i < world_; ++i) {
      const int p = (start + i) % world_;
      if (p == rank_) continue;
      Peer& peer = peers_[p];
      if (peer.named > 0 || peer.in_active) {
        moved |= pull_receive(p, peer);
        continue;
      }
      // Read for a receive from any source only: a peer that closed its
      // communicator in order sends nothing more, the others still may. A
      // peer that died or aborted fails the receive.
      try {
        moved |= pull_receive(p, peer);
      } catch (const Error& e) {
        if (std::string(e.what()).find(" closed its communicator") == std::string::npos) throw;
        if (++closed == world_ - 1) throw;  // nobody is left to send
      }
    }
  } else {
    for (int p = 0; p < world_; ++p) {
      Peer& peer = peers_[p];
      if (p != rank_ && (peer.named > 0 || (peer.in_active && peer.in_op))) moved |= pull_receive(p, peer);
    }
  }
  return moved;
}

std::string P2pMatcher::waiting_text(const P2pOp& op) {
  if (op.is_send) {
    if (op.pull && op.announced) {
      return "waiting for rank " + num(op.peer) + " to receive the message (" + tag_text(op.tag) +
             ", it reads it from this rank's memory)";
    }
    return "waiting for rank " + num(op.peer) + " to take data (" + tag_text(op.tag) + ", " + num(op.done) + " of " +
           num(op.nbytes) + " bytes sent)";
  }
  std::string s = "waiting for a message with " + tag_text(op.tag) + " from " +
                  (op.peer == kAnySource ? std::string("any rank") : "rank " + num(op.peer));
  if (op.matched) s = "receiving the message with " + tag_text(op.tag) + " from rank " + num(op.source) + " (" +
                      num(op.done) + " of " + num(op.nbytes) + " bytes arrived)";
  std::string held;
  for (int q = 0; q < world_; ++q) {
    const Peer& peer = peers_[q];
    if (peer.held.empty()) continue;
    std::string tags;
    int listed = 0;
    for (const Held& m : peer.held) {
      if (listed++ == 8) {
        tags += ", ...";
        break;
      }
      tags += (tags.empty() ? "" : ", ") + std::to_string(m.tag);
    }
    held += std::string(held.empty() ? "" : "; ") + "from rank " + num(q) + ": " + num(peer.held.size()) +
            " message(s), tags " + tags;
  }
  if (!held.empty()) s += "; held unmatched: " + held;
  const std::string limit = limit_text();
  if (!limit.empty()) s += "; " + limit;
  return s;
}

std::string P2pMatcher::limit_text() const {
  std::string s;
  for (int q = 0; q < world_; ++q) {
    if (peers_[q].blocked) {
      s += std::string(s.empty() ? "" : "; ") + "rank " + num(q) +
           "'s next message does not fit under the limit on held unmatched messages (" + num(cap_) + " bytes, " +
           num(held_bytes_) + " held; RINGCOMM_P2P_UNEXPECTED_MB): receive the held messages first or raise the limit";
    }
  }
  return s;
}

}  // namespace ringcomm
