#include "comm/executor.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "comm/describe.h"
#include "ringcomm/copy.h"
#include "ringcomm/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ringcomm {

void relax_cpu() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void yield_cpu() { sched_yield(); }

namespace {

// Reduction chunks read from a peer: small enough to stay in L2.
constexpr size_t kPullChunk = 256 * 1024;

}  // namespace

Executor::Executor(Transport* transport, int rank, int world, WaitPolicy policy)
    : transport_(transport),
      rank_(rank),
      world_(world),
      policy_(policy),
      busy_(world),
      pull_tmp_(kPullChunk + 2 * 4096),
      peer_links_(static_cast<size_t>(world)) {
  progress_.reserve(1024);  // as the communicator's schedule: no allocation per call
}  // room to place the chunk at any page offset

const Executor::PeerLink& Executor::look_up_link(int p) {
  PeerLink& l = peer_links_[static_cast<size_t>(p)];
  Link* link = transport_->link(p);  // throws for a peer this rank has no link to
  l.slot_bytes = link->slot_bytes();
  l.ref_min = link->ref_min_bytes();
  l.post_min = link->post_min_bytes();
  l.link = link;
  return l;
}

// Single copy from a peer's buffer; a reducing pull goes through a small
// buffer that stays in cache, placed at the destination's page offset (copies
// between buffers at different offsets within a page run ~3x slower).
void Executor::pull(const Step& s, const Reducer* reducer) {
  Link* link = transport_->link(s.recv_peer);
  uint64_t base;
  std::memcpy(&base, bufs_->at(s.remote_base), sizeof(base));
  const uint64_t addr = base + s.remote_offset;
  char* const dst = bufs_->at(s.dst);
  if (s.kind == StepKind::kPull) {
    if (s.nbytes) link->read_remote(dst, addr, s.nbytes);
    return;
  }
  const char* const src = bufs_->at(s.src);
  char* tmp = pull_tmp_.data() + (4096 - (reinterpret_cast<uintptr_t>(pull_tmp_.data()) & 4095)) % 4096;
  tmp += reinterpret_cast<uintptr_t>(dst) & 4095;
  const size_t chunk = kPullChunk / reducer->elem_size * reducer->elem_size;
  for (size_t off = 0; off < s.nbytes; off += chunk) {
    const size_t n = std::min(chunk, s.nbytes - off);
    link->read_remote(tmp, addr + off, n);
    reducer->fn(dst + off, src + off, tmp, n / reducer->elem_size);
    if (s.divide) reducer->divide(dst + off, n / reducer->elem_size, world_);
  }
}

void Executor::check_header(const MsgTag& expect, int peer, uint64_t segment, const MsgHeader& h,
                            size_t expect_bytes) const {
  if (!(h.tag == expect)) {
    throw MismatchError("ringcomm: mismatched calls: rank " + std::to_string(rank_) + " is in " +
                describe_tag(expect) + " but rank " + std::to_string(peer) + " sent " +
                describe_tag(h.tag) + "; all ranks must issue the same collectives in the same order");
  }
  if (h.segment != segment || h.nbytes != expect_bytes) {
    throw Error("ringcomm: " + describe_tag(expect) + " on rank " + std::to_string(rank_) +
                ": expected segment " + std::to_string(segment) + " of " + std::to_string(expect_bytes) +
                " bytes from rank " + std::to_string(peer) + ", got segment " + std::to_string(h.segment) +
                " of " + std::to_string(h.nbytes) + " bytes");
  }
}

void Executor::run_local(const Step& s, char* dst, const char* src, const char* src2, const Reducer* reducer) {
  if (s.kind == StepKind::kFence) {
  } else if (s.kind == StepKind::kLocalCopy) {
    const bool apart = dst + s.nbytes <= src || src + s.nbytes <= dst;
    if (s.nbytes >= kStreamingCopyMinBytes && apart) {
      copy_streaming(dst, src, s.nbytes);
    } else if (s.nbytes) {
      std::memmove(dst, src, s.nbytes);
    }
  } else if (s.kind == StepKind::kPublish) {
    const uint64_t a = reinterpret_cast<uintptr_t>(src);
    std::memcpy(dst, &a, sizeof(a));
  } else {
    const size_t n = s.nbytes / reducer->elem_size;
    reducer->fn(dst, src, src2, n);
    if (s.divide) reducer->divide(dst, n, world_);
  }
}

// Moves one step as far as its FIFOs allow. Returns whether anything moved.
bool Executor::advance(const Step& s, StepProgress& p, const Reducer* reducer) {
  bool moved = false;
  const MsgTag& tag = *tag_;
  if (s.kind == StepKind::kAckPull) {
    transport_->link(s.send_peer)->ack_pull(tag.seq);
    p.complete = true;
    return true;
  }
  if (s.kind == StepKind::kAwaitPull) {
    p.complete = transport_->link(s.recv_peer)->pulled() >= tag.seq;
    return p.complete;
  }
  if (is_pull(s.kind)) {
    pull(s, reducer);
    p.complete = true;
    return true;
  }
  char* const dst = bufs_->at(s.dst);
  const char* const src = bufs_->at(s.src);
  if (is_local(s.kind)) {
    run_local(s, dst, src, bufs_->at(s.src2), reducer);
    p.complete = true;
    return true;
  }
  Link* in = s.recv_peer >= 0 ? peer_link(s.recv_peer).link : nullptr;
  Link* out = s.send_peer >= 0 ? peer_link(s.send_peer).link : nullptr;
  const size_t slot = peer_link(in ? s.recv_peer : s.send_peer).slot_bytes;
  // Segments this large leave from the call's memory (Link::send_ref) where
  // the step sends bytes that stay in a buffer of the call: kSend's source,
  // the destination the copy or the reduction has just written. The step is
  // complete once the link no longer reads them (a later step may write
  // there).
  const size_t ref_min = out && s.kind != StepKind::kRecvReduceSend ? peer_link(s.send_peer).ref_min : SIZE_MAX;
  // The large segments of a step that receives without reducing land in
  // place (Link::post_recv); one that also forwards them (kRecvCopySend)
  // sends each from there once it has landed (p.fwd trails p.done).
  const bool forwards = s.kind == StepKind::kRecvCopySend;
  const size_t post_min =
      s.kind == StepKind::kRecv || forwards ? peer_link(s.recv_peer).post_min : SIZE_MAX;
  while (!p.complete) {
    if (p.posted) {
      bool over = false;
      if (in->take_landed(slot, &p.landed, &p.done, &p.segment, &over)) moved = true;
      if (over) p.posted = false;
    }
    if (forwards && p.fwd < p.done) {  // landed in place, not sent on yet
      const size_t n = std::min(slot, s.nbytes - p.fwd);
      char* slot_ptr = out->send_slot(page_offset(dst + p.fwd), n);
      if (!slot_ptr) break;
      MsgHeader oh;
      oh.tag = tag;
      oh.nbytes = static_cast<uint32_t>(n);
      oh.segment = p.fwd_segment;
      if (const uint64_t t = out->send_from(slot_ptr, dst + p.fwd, oh, ref_min)) p.ticket = t;
      p.fwd += n;
      ++p.fwd_segment;
      moved = true;
      continue;
    }
    // Everything moved (an empty step: its one empty segment), and a post has
    // ended (all its bytes may show before posted() says it is over).
    if (p.done == s.nbytes && p.segment > 0 && !p.posted) {
      if (p.ticket && !out->sent(p.ticket)) break;  // the link still reads segments sent by reference
      p.complete = true;
      moved = true;
      break;
    }
    if (p.posted) break;  // the rest is still landing
    const size_t n = std::min(slot, s.nbytes - p.done);
    if (n >= post_min && in->post_recv(dst + p.done, s.nbytes - p.done, tag, p.segment, slot)) {
      p.posted = true;
      p.landed = 0;
      continue;
    }
    const bool by_ref = n >= ref_min;
    const char* payload = nullptr;
    const MsgHeader* h = nullptr;
    if (in) {
      h = in->recv_peek(&payload);
      if (!h) break;
      bool absorbed = false;
      if (absorbed_p2p(tag, s.recv_peer, *h, &absorbed)) {
        if (!absorbed) break;  // the rest of that message has not arrived (or cannot be held yet)
        moved = true;
        continue;  // the collective's own data may be next
      }
      check_header(tag, s.recv_peer, p.segment, *h, n);
    }
    char* slot_ptr = nullptr;
    if (out) {
      const void* align_to = s.kind == StepKind::kSend             ? src + p.done
                             : s.kind == StepKind::kRecvReduceSend ? src + p.done
                                                                   : dst + p.done;
      slot_ptr = out->send_slot(page_offset(align_to), n);
      if (!slot_ptr) break;
    }
    const size_t elems = reducer ? n / reducer->elem_size : 0;
    switch (s.kind) {
      case StepKind::kSend:
        if (!by_ref) out->fill_slot(slot_ptr, src + p.done, n);
        break;
      case StepKind::kRecv:
        in->copy_out(dst + p.done, payload, n, streaming_ || s.nbytes >= kStreamingCopyMinBytes);
        break;
      case StepKind::kRecvReduce:
        in->read_payload(n, [&] { reducer->fn(dst + p.done, src + p.done, payload, elems); });
        if (s.divide) reducer->divide(dst + p.done, elems, world_);
        break;
      case StepKind::kRecvReduceSend:
        in->read_payload(n, [&] { reducer->fn(slot_ptr, src + p.done, payload, elems); });
        break;
      case StepKind::kRecvReduceCopySend:
        in->read_payload(n, [&] { reducer->fn(dst + p.done, src + p.done, payload, elems); });
        if (s.divide) reducer->divide(dst + p.done, elems, world_);
        if (!by_ref) out->fill_slot(slot_ptr, dst + p.done, n);
        break;
      case StepKind::kRecvCopySend:
        // Both copies read the payload (the second from the cache), not dst
        // (it may have been written around the cache); the first is the
        // slot's copy out (timed, see Link::copy_out).
        in->copy_out(dst + p.done, payload, n, streaming_ || s.nbytes >= kStreamingCopyMinBytes);
        if (!by_ref) out->fill_slot(slot_ptr, payload, n);
        break;
      default:
        break;
    }
    if (out) {
      MsgHeader oh;
      oh.tag = tag;
      oh.nbytes = static_cast<uint32_t>(n);
      oh.segment = p.segment;
      if (by_ref) {
        // send_slot said a slot is free: the reference takes it.
        p.ticket = out->send_ref(s.kind == StepKind::kSend ? src + p.done : dst + p.done, oh);
      } else {
        out->send_commit(oh);
      }
    }
    if (in) in->recv_release();
    p.done += n;
    ++p.segment;
    p.fwd = p.done;  // (kRecvCopySend) received and sent on together
    p.fwd_segment = p.segment;
    moved = true;  // the next round completes the step once everything moved
  }
  return moved;
}

namespace {

// Whether [a, a+an) and [b, b+bn) share a byte (same buffer).
bool overlap(BufRef a, size_t an, BufRef b, size_t bn) {
  return a.buf == b.buf && a.buf != kNone && a.offset < b.offset + bn && b.offset < a.offset + an;
}

}  // namespace

FlatShape Executor::flat_shape(const Schedule& steps) {
  FlatShape shape;
  const size_t n = steps.size();
  if (n > FlatShape::kMaxSteps) return shape;
  // The transfers first (plain sends and receives, no `after`, each on a
  // FIFO no other step of the plan uses), then only local steps.
  size_t transfers = 0;
  for (; transfers < n; ++transfers) {
    const Step& s = steps[transfers];
    if (s.kind != StepKind::kSend && s.kind != StepKind::kRecv) break;
    if (s.after != SIZE_MAX) return shape;
    for (size_t j = 0; j < transfers; ++j) {
      const Step& o = steps[j];
      if (o.kind == s.kind && (s.kind == StepKind::kSend ? o.send_peer == s.send_peer : o.recv_peer == s.recv_peer)) {
        return shape;
      }
    }
  }
  for (size_t i = transfers; i < n; ++i) {
    if (!is_local(steps[i].kind)) return shape;
    shape.from[i - transfers] = {FlatShape::kOwn, FlatShape::kOwn};
  }
  shape.transfers = static_cast<int>(transfers);
  // Held receives: into scratch (dead after the call), nothing else of the
  // plan touching their bytes but local reads of exactly the message.
  for (size_t i = 0; i < transfers; ++i) {
    const Step& r = steps[i];
    if (r.kind != StepKind::kRecv || r.dst.buf != kScratch || r.nbytes == 0) continue;
    bool ok = true;
    std::array<std::array<int8_t, 2>, FlatShape::kMaxSteps> from = shape.from;
    for (size_t j = 0; j < n && ok; ++j) {
      if (j == i) continue;
      const Step& s = steps[j];
      if (j < transfers) {  // another transfer's bytes
        ok = !overlap(s.kind == StepKind::kSend ? s.src : s.dst, s.nbytes, r.dst, r.nbytes);
        continue;
      }
      if (s.kind == StepKind::kFence) continue;
      if (s.kind == StepKind::kPublish) {  // writes 8 bytes at dst; reads src's address
        ok = !overlap(s.dst, sizeof(uint64_t), r.dst, r.nbytes) && !overlap(s.src, 1, r.dst, r.nbytes);
        continue;
      }
      if (overlap(s.dst, s.nbytes, r.dst, r.nbytes)) {
        ok = false;
        continue;
      }
      const BufRef reads[2] = {s.src, s.kind == StepKind::kLocalReduce ? s.src2 : BufRef{}};
      for (int k = 0; k < 2 && ok; ++k) {
        if (!overlap(reads[k], s.nbytes, r.dst, r.nbytes)) continue;
        if (reads[k] == r.dst && s.nbytes == r.nbytes) {
          from[j - transfers][k] = static_cast<int8_t>(i);
        } else {
          ok = false;
        }
      }
    }
    if (ok) {
      shape.held |= uint64_t{1} << i;
      shape.from = from;
    }
  }
  return shape;
}

bool Executor::run_flat(const Schedule& steps, const FlatShape& shape, const Reducer* reducer,
                        const Clock::time_point& deadline, const CallInfo& info) {
  const size_t n = steps.size(), transfers = static_cast<size_t>(shape.transfers);
  // Each transfer's link, looked up once; a transfer of more than one
  // segment hands the plan to the general passes before anything moves.
  for (size_t i = 0; i < transfers; ++i) {
    const Step& s = steps[i];
    const PeerLink& l = peer_link(s.kind == StepKind::kSend ? s.send_peer : s.recv_peer);
    links_[i] = l.link;
    if (s.nbytes > l.slot_bytes) return false;
  }
  uint64_t pending = transfers == 64 ? ~uint64_t{0} : (uint64_t{1} << transfers) - 1;  // bit i: transfer i
  drive(
      [&] {
        bool moved = false;
        for (uint64_t m = pending; m; m &= m - 1) {
          const size_t i = static_cast<size_t>(__builtin_ctzll(m));
          if (flat_transfer(steps[i], links_[i], (shape.held >> i) & 1, i)) {
            moved = true;
            pending &= ~(uint64_t{1} << i);
          }
        }
        return moved;
      },
      [&] { return pending == 0; }, deadline, info,
      [&] {
        first_ = static_cast<size_t>(__builtin_ctzll(pending));  // the transfer waited for
        fail_timeout(steps, *info_);
      });
  // Every transfer is complete: the local steps, in order.
  for (size_t i = transfers; i < n; ++i) {
    const Step& s = steps[i];
    const std::array<int8_t, 2>& from = shape.from[i - transfers];
    const char* src = from[0] == FlatShape::kOwn ? bufs_->at(s.src) : held_[from[0]];
    const char* src2 = from[1] == FlatShape::kOwn ? bufs_->at(s.src2) : held_[from[1]];
    // A step that reads a segment where it arrived is that link's read of
    // it, timed as copy_out times its copies: without these samples a link
    // whose reader only folds in place never learns that its slots would be
    // cheaper written around the caches (ShmLink's slot stores).
    const int8_t read = from[1] != FlatShape::kOwn ? from[1] : from[0];
    if (read != FlatShape::kOwn) {
      links_[read]->read_payload(s.nbytes, [&] { run_local(s, bufs_->at(s.dst), src, src2, reducer); });
    } else {
      run_local(s, bufs_->at(s.dst), src, src2, reducer);
    }
  }
  for (uint64_t h = shape.held; h; h &= h - 1) links_[__builtin_ctzll(h)]->recv_release();
  return true;
}

// A send or receive of one segment (run_flat): advance() without the
// general loop. Returns whether it moved (it then is complete).
bool Executor::flat_transfer(const Step& s, Link* link, bool held, size_t i) {
  if (s.kind == StepKind::kSend) {
    const char* src = bufs_->at(s.src);
    char* slot = link->send_slot(page_offset(src), s.nbytes);
    if (!slot) return false;
    link->fill_slot(slot, src, s.nbytes);
    MsgHeader oh;
    oh.tag = *tag_;
    oh.nbytes = static_cast<uint32_t>(s.nbytes);
    oh.segment = 0;
    link->send_commit(oh);
  } else {
    for (;;) {
      const char* payload = nullptr;
      const MsgHeader* h = link->recv_peek(&payload);
      if (!h) return false;
      bool absorbed = false;
      if (absorbed_p2p(*tag_, s.recv_peer, *h, &absorbed)) {
        if (!absorbed) return false;
        continue;  // the collective's own data may be next
      }
      check_header(*tag_, s.recv_peer, 0, *h, s.nbytes);
      if (held) {
        held_[i] = payload;  // read by the local steps, released after them
        break;
      }
      link->copy_out(bufs_->at(s.dst), payload, s.nbytes, streaming_ || s.nbytes >= kStreamingCopyMinBytes);
      link->recv_release();
      break;
    }
  }
  return true;
}

// One pass over the active window, in the order comm/step_order.h sets.
bool Executor::pass(const Schedule& steps, const Reducer* reducer, size_t window) {
  // Steps appended by a refill get their progress here.
  if (progress_.size() < steps.size()) progress_.resize(steps.size());
  return ordered_pass(steps, progress_.data(), &first_, window, busy_,
                      [&](size_t i) { return advance(steps[i], progress_[i], reducer); });
}

std::string call_name(const CallInfo& info) {
  return info.p2p ? p2p_call_name(info.p2p == 1, info.p2p_peer, info.p2p_tag) : std::string(info.op);
}

namespace {

std::string call_text(const CallInfo& info) {
  return call_name(info) + " (seq " + std::to_string(info.seq) + ") on rank " + std::to_string(info.rank);
}

// A peer that failed with a mismatch makes this rank's error a mismatch too,
// and one that timed out in it (a rank skipped the call) a timeout: every
// rank left waiting by the skipper raises the same type, whether its own
// deadline or a faster peer's abort notice ends its wait first.
[[noreturn]] void throw_classified(const std::string& message) {
  if (mentions_revoke(message)) throw RevokedError(message);
  if (message.find("mismatched calls") != std::string::npos) throw MismatchError(message);
  if (message.find(": Timed out after ") != std::string::npos) throw TimeoutError(message);
  throw Error(message);
}

const char* state_name(uint8_t state) {
  switch (static_cast<CallState>(state)) {
    case CallState::kIssued: return "queued";
    case CallState::kRunning: return "running";
    case CallState::kFinished: return "finished";
    case CallState::kFailed: return "failed";
    default: return "?";
  }
}

std::string record_text(const CallRecordView& r) {
  std::string s = r.p2p == 1   ? "send to rank " + std::to_string(r.peer)
                  : r.p2p == 2 ? (r.peer < 0 ? std::string("recv from any rank") : "recv from rank " + std::to_string(r.peer))
                               : std::string(op_kind_name(static_cast<OpKind>(r.kind)));
  return s + " (seq " + std::to_string(r.seq) + "), " + state_name(r.state);
}

}  // namespace

void Executor::check_peers_alive() {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    std::string why = transport_->peer_abort_reason(p);
    if (!why.empty()) {
      throw_classified("ringcomm: " + call_text(*info_) + " failed because rank " + std::to_string(p) +
                       " aborted: " + why);
    }
  }
}

void Executor::rethrow_peer_lost(const PeerLostError& e) const {
  throw_classified("ringcomm: " + call_text(*info_) + " failed: " + e.what());
}

void Executor::periodic_checks(Clock::time_point now, bool waiting) {
  std::string why = transport_->local_abort_reason();
  if (!why.empty()) {
    if (mentions_revoke(why)) throw RevokedError("ringcomm: " + call_text(*info_) + " stopped: " + why);
    throw Error("ringcomm: " + call_text(*info_) + " stopped: this rank aborted: " + why);
  }
  check_interrupted(now, &last_interrupt_, [&] { return call_text(*info_); });
  if (!waiting) return;
  check_peers_alive();
  if (now - last_poll_ >= std::chrono::milliseconds(10)) {
    last_poll_ = now;
    transport_->poll_peers();  // a dead peer is reported by its link at the next step
  }
}

std::string Executor::peers_activity(const CallInfo& info) const {
  if (info.kind < 0) return {};
  transport_->request_peer_calls();  // peers over TCP answer within a few round trips
  std::string out;
  int listed = 0;
  const bool p2p = info.p2p_peer >= 0;
  for (int p = 0; p < world_ && listed < 8; ++p) {
    if (p == rank_ || (p2p && p != info.p2p_peer)) continue;
    CallRecordView r;
    if (!transport_->peer_call(p, p2p, &r)) continue;
    std::string s = "rank " + std::to_string(p) + " ";
    const std::string mine = call_name(info) + " (seq " + std::to_string(info.seq) + ")";
    if (p2p) {
      // Point-to-point counters run per pair and direction: just say what it did last.
      s += r.state == static_cast<uint8_t>(CallState::kNone) ? "has made no send/recv call yet"
                                                              : "last did " + record_text(r);
    } else if (r.state == static_cast<uint8_t>(CallState::kNone)) {
      s += "never called " + mine + "; it has made no collective call yet";
    } else if (r.seq < info.seq) {
      s += "never called " + mine + "; its last call was " + record_text(r);
    } else if (r.seq == info.seq && r.kind == info.kind) {
      s += "is in it: " + record_text(r);
    } else if (r.seq == info.seq) {
      s += "called " + record_text(r) + " instead";
    } else {
      s += "is past it, in " + record_text(r);
    }
    out += (listed++ ? "; " : "") + s;
  }
  return out;
}

void Executor::fail_timeout(const Schedule& steps, const CallInfo& info) {
  const Step& s = steps[first_];
  std::string what;
  const char* payload = nullptr;
  if (s.kind == StepKind::kAwaitPull) {
    what = "waiting for rank " + std::to_string(s.recv_peer) + " to read the message";
  } else if (s.recv_peer >= 0 && (s.send_peer < 0 || !transport_->link(s.recv_peer)->recv_peek(&payload))) {
    what = "waiting for data from rank " + std::to_string(s.recv_peer);
  } else {
    what = "waiting for rank " + std::to_string(s.send_peer) + " to take data";
  }
  throw_timeout(info, what);
}

void Executor::throw_timeout(const CallInfo& info, const std::string& what) const {
  std::string peers = peers_activity(info);
  throw TimeoutError("ringcomm: " + call_name(info) + " (seq " + std::to_string(info.seq) + ") on rank " +
                     std::to_string(rank_) + ": Timed out after " + seconds_text(info.timeout_s) + " s " + what +
                     (peers.empty() ? " (did every rank call it?)" : ": " + peers));
}

void Executor::run_general(const Schedule& steps, const PlanBuffers& bufs, const MsgTag& tag,
                           const Reducer* reducer, const Clock::time_point& deadline, const CallInfo& info,
                           const std::function<bool()>* refill, const FlatShape* flat) {
  bufs_ = &bufs;
  tag_ = &tag;
  first_ = 0;
  if (!refill && !flat) {
    const FlatShape here = flat_shape(steps);
    if (here.transfers >= 0 && run_flat(steps, here, reducer, deadline, info)) return;
  }
  progress_.resize(steps.size());  // within the reserved capacity: no allocation
  for (StepProgress& p : progress_) p = StepProgress{};
  const size_t window = refill ? SIZE_MAX / 2 : step_window(world_);
  drive([&] {
          bool changed = refill && (*refill)();
          return pass(steps, reducer, window) || changed;
        },
        [&] { return first_ >= steps.size(); }, deadline, info, [&] { fail_timeout(steps, *info_); });
}

}  // namespace ringcomm
