// Runs a Schedule over a Transport: moves every Step forward one segment at a
// time, as far as the FIFOs allow, until all are complete or the deadline
// passes. Waiting escalates from spinning to yielding to sleeping.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "algo/step.h"
#include "comm/describe.h"
#include "comm/step_order.h"
#include "ringcomm/interrupt.h"
#include "ringcomm/reducer.h"
#include "ringcomm/types.h"
#include "transport/transport.h"

namespace ringcomm {

void relax_cpu();  // a pause instruction
void yield_cpu();  // sched_yield

// How long a rank with nothing to do spins, then yields the CPU, before it
// sleeps on the transport (waking a sleeper costs tens of microseconds on a
// VM; spinning for long starves oversubscribed ranks).
struct WaitPolicy {
  Clock::duration spin = std::chrono::microseconds(50);
  Clock::duration yield = std::chrono::microseconds(1000);
};

// What a failing executor reports about the call it was running.
struct CallInfo {
  // "all_reduce", "send": the op's name (a literal: no string is built per
  // call); call_name() words a send/recv in full.
  const char* op = "";
  uint64_t seq = 0;
  int rank = -1;
  double timeout_s = 0;
  int kind = -1;     // OpKind, for what the peers' records are compared with
  int p2p_peer = -1;  // point-to-point calls: the peer (seq counts messages to/from it; -1: any source)
  int p2p = 0;        // 1: a send, 2: a recv
  int64_t p2p_tag = 0;
};

// "all_reduce", "send to rank 3 (tag 5)": the call as messages name it.
std::string call_name(const CallInfo& info);



// A plan of run_flat's shape (Executor::flat_shape): its leading transfers
// (plain sends and receives of one segment, each on a FIFO of its own),
// then local steps. A receive into scratch whose data the local steps only
// read, each read naming exactly that message, is `held`: its payload is
// read where it lies in the FIFO, and the slot released when the local
// steps are done (the one-shot fold reduces its peers' inputs in place).
struct FlatShape {
  static constexpr size_t kMaxSteps = 64;
  static constexpr int8_t kOwn = -1;
  int transfers = -1;  // -1: not of the shape
  uint64_t held = 0;   // bit i: transfer i is a held receive
  // For the local step `transfers + j`: the held receive whose payload its
  // src ([j][0]) and src2 ([j][1]) read, or kOwn (the step's own BufRef).
  std::array<std::array<int8_t, 2>, kMaxSteps> from{};
};

class Executor {
 public:
  Executor(Transport* transport, int rank, int world, WaitPolicy policy);
  void set_policy(WaitPolicy policy) { policy_ = policy; }
  // Whether the call about to run writes a destination so large that data
  // received is copied out around the caches (ringcomm/copy.h); each step of
  // at least kStreamingCopyMinBytes is anyway.
  void set_streaming(bool on) { streaming_ = on; }
  // The links of the transport are looked up once per peer (they live as
  // long as the transport does); after a set-up step that adds links, the
  // communicator makes the executor forget what it looked up.
  void forget_links() {
    for (PeerLink& l : peer_links_) l = PeerLink{};
  }
  // Called when a collective's receive finds a point-to-point message at the
  // head of peer p's FIFO (comm/p2p_match.cpp): it must take what has
  // arrived of it out of the way; returns whether anything moved.
  void set_p2p_absorb(std::function<bool(int)> absorb) { absorb_ = std::move(absorb); }
  // The same for a receive of run(): whether `h` from `peer` was a
  // point-to-point message, handed over.
  bool absorbed_p2p(const MsgTag& expect, int peer, const MsgHeader& h, bool* moved) {
    if (h.tag.kind != kP2pKind || expect.kind == kP2pKind || !absorb_) return false;
    if (absorb_(peer)) *moved = true;
    return true;
  }

  // Runs `steps` to completion over the call's buffers `bufs` (each step's
  // BufRefs resolve against them), every message carrying the header `tag`.
  // Throws TimeoutError (naming the op, sequence number, this rank and the
  // peer waited for) or Error (mismatched headers, a peer that aborted).
  // `deadline` and `info` are read as the run goes.
  //
  // `refill`, when given, runs before every pass and may append steps (and
  // move `deadline` / `info` to the oldest unfinished call): that is how a
  // stream of point-to-point calls progresses together. It returns whether
  // it changed anything. Appended steps are all looked at in every pass;
  // otherwise a pass looks at a bounded window after the first unfinished step.
  //
  // `steps` is only read: the progress of each step is the executor's own
  // (StepProgress), so a schedule may be kept and run again.
  //
  // `flat`: flat_shape(steps) when the caller keeps it with the plan (a
  // kept plan's shape is worked out once), null to have run() do it.
  void run(const Schedule& steps, const PlanBuffers& bufs, const MsgTag& tag, const Reducer* reducer,
           const Clock::time_point& deadline, const CallInfo& info, const std::function<bool()>* refill = nullptr,
           const FlatShape* flat = nullptr) {
    // A kept plan of run_flat's shape goes straight there (the latency path).
    if (!refill && flat && flat->transfers >= 0) {
      bufs_ = &bufs;
      tag_ = &tag;
      first_ = 0;
      if (run_flat(steps, *flat, reducer, deadline, info)) return;
    }
    run_general(steps, bufs, tag, reducer, deadline, info, refill, flat);
  }
  // The shape of a plan as run_flat (below) runs it; transfers -1 for a
  // plan of any other shape.
  static FlatShape flat_shape(const Schedule& steps);

  // The waiting loop of run(), for callers that move data themselves (the
  // send/recv groups): calls `step` (returns whether anything moved)
  // until `done()`, spinning, yielding, then sleeping between fruitless
  // steps; past the deadline calls `on_timeout` (which must throw); fails
  // when a peer announced an abort.
  template <class StepF, class DoneF, class TimeoutF>
  void drive(StepF&& step, DoneF&& done, const Clock::time_point& deadline, const CallInfo& info,
             TimeoutF&& on_timeout);

  // Throws the TimeoutError of a call: "ringcomm: <op> (seq N) on rank R timed
  // out after T s <what> (did every rank call it?)", followed by what each
  // peer whose record this rank can read was doing ("rank 2 never called
  // all_reduce (seq 41); its last call was broadcast (seq 40), finished").
  [[noreturn]] void throw_timeout(const CallInfo& info, const std::string& what) const;
  // What the peers were doing, as throw_timeout words it ("" when unknown).
  std::string peers_activity(const CallInfo& info) const;

  // Throws the mismatch error unless `h` is segment `segment` of `expect`
  // with `expect_bytes` bytes, as sent by rank `peer`.
  void check_header(const MsgTag& expect, int peer, uint64_t segment, const MsgHeader& h,
                    size_t expect_bytes) const;

 private:
  // Peer p's link and its slot size (transport_->link(p), asked once).
  struct PeerLink {
    Link* link = nullptr;
    size_t slot_bytes = 0;
    size_t ref_min = SIZE_MAX;  // segments of at least this many bytes may be sent by reference
    size_t post_min = SIZE_MAX;  // ... and received in place (Link::post_recv)
  };
  const PeerLink& peer_link(int p) {
    const PeerLink& l = peer_links_[static_cast<size_t>(p)];
    return l.link ? l : look_up_link(p);
  }
  const PeerLink& look_up_link(int p);
  // run() of any plan: run_flat when the shape is worked out here and fits,
  // the general passes otherwise.
  void run_general(const Schedule& steps, const PlanBuffers& bufs, const MsgTag& tag, const Reducer* reducer,
                   const Clock::time_point& deadline, const CallInfo& info, const std::function<bool()>* refill,
                   const FlatShape* flat);
  bool pass(const Schedule& steps, const Reducer* reducer, size_t window);
  // Plans of the latency path's shape (the one-shot all_reduce of a small
  // message, a barrier round, ...): a few plain sends and receives of one
  // segment each, every one on a FIFO of its own, then local steps. The
  // ordering rules (comm/step_order.h) then reduce to "the transfers in any
  // order, then the local steps in list order", which run_flat does without
  // the general passes. Returns false, having moved nothing, when a
  // transfer needs more than one segment of its link.
  bool run_flat(const Schedule& steps, const FlatShape& shape, const Reducer* reducer,
                const Clock::time_point& deadline, const CallInfo& info);
  // Moves one transfer of run_flat over its link; whether it did (it is then
  // complete). `held`: the receive's payload stays in its slot (held_[i]).
  bool flat_transfer(const Step& s, Link* link, bool held, size_t i);
  // A local step over resolved memory (advance and run_flat).
  void run_local(const Step& s, char* dst, const char* src, const char* src2, const Reducer* reducer);
  bool advance(const Step& s, StepProgress& p, const Reducer* reducer);
  void pull(const Step& s, const Reducer* reducer);
  [[noreturn]] void fail_timeout(const Schedule& steps, const CallInfo& info);
  void check_peers_alive();
  // Every few milliseconds of a call: this rank aborted (another thread),
  // Ctrl-C, peers' processes.
  void periodic_checks(Clock::time_point now, bool waiting);
  [[noreturn]] void rethrow_peer_lost(const PeerLostError& e) const;

  static constexpr uint8_t kP2pKind = static_cast<uint8_t>(OpKind::kSend);
  std::function<bool(int)> absorb_;
  Transport* transport_;
  int rank_;
  int world_;
  WaitPolicy policy_;
  size_t first_ = 0;  // first incomplete step
  bool streaming_ = false;
  std::vector<StepProgress> progress_;  // one per step of the running schedule (reused)
  std::array<const char*, FlatShape::kMaxSteps> held_{};  // run_flat: the held receives' payloads
  std::array<Link*, FlatShape::kMaxSteps> links_{};       // run_flat: each transfer's link
  std::vector<PeerLink> peer_links_;                       // per peer (peer_link)
  FifoMarks busy_;
  std::vector<char> pull_tmp_;
  const CallInfo* info_ = nullptr;
  const PlanBuffers* bufs_ = nullptr;  // the running schedule's buffers and header
  const MsgTag* tag_ = nullptr;
  Clock::time_point last_poll_{};       // poll_peers
  Clock::time_point last_interrupt_{};  // interrupt check
};

template <class StepF, class DoneF, class TimeoutF>
void Executor::drive(StepF&& step, DoneF&& done, const Clock::time_point& deadline, const CallInfo& info,
                     TimeoutF&& on_timeout) {
  info_ = &info;
  uint64_t idle = 0, busy = 0;
  Clock::time_point idle_since;
  enum { kSpin, kYield, kSleep } phase = kSpin;
  try {
    // Peers that failed before this call started make it fail too, even when
    // everything it needs from them is already here.
    if (transport_->any_peer_aborted()) check_peers_alive();
    for (;;) {
      if (step()) {
        if (done()) return;
        idle = 0;
        // A long transfer that never waits still looks at aborts and Ctrl-C.
        if ((++busy & 1023) == 0) periodic_checks(Clock::now(), false);
        continue;
      }
      if (done()) return;
      if (idle++ == 0) {
        idle_since = Clock::now();
        phase = kSpin;
      }
      if ((idle & 63) == 0 || phase == kSleep) {
        Clock::time_point now = Clock::now();
        if (now > deadline) on_timeout();
        auto waited = now - idle_since;
        phase = waited < policy_.spin ? kSpin : waited < policy_.spin + policy_.yield ? kYield : kSleep;
        periodic_checks(now, phase != kSpin);
      }
      if (phase == kSpin) {
        // A yield now and then costs little when the core is ours, and lets a
        // peer that shares this core run (more ranks than cores, or other load).
        if ((idle & 255) == 0) {
          yield_cpu();
        } else {
          relax_cpu();
        }
      } else if (phase == kYield) {
        yield_cpu();
      } else {
        bool moved = false;
        transport_->sleep(deadline, [&] { return moved = step(); });
        if (moved) idle = 0;
      }
    }
  } catch (const PeerLostError& e) {
    transport_->release_refs();
    rethrow_peer_lost(e);
  } catch (...) {
    transport_->release_refs();  // nothing reads the call's memory once it has failed
    throw;
  }
}

}  // namespace ringcomm
