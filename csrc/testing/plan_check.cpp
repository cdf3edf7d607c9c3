#include "testing/plan_check.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "algo/schedules.h"
#include "comm/call_check.h"
#include "comm/device_executor.h"
#include "comm/step_order.h"
#include "ringcomm/types.h"

namespace ringcomm {
namespace {

// A plan error found while checking; becomes PlanCheckResult::error.
struct PlanFault {
  std::string what;
};
[[noreturn]] void fault(std::string what) { throw PlanFault{std::move(what)}; }

std::string str(size_t v) { return std::to_string(v); }

const char* step_name(StepKind k) {
  switch (k) {
    case StepKind::kSend: return "send";
    case StepKind::kRecv: return "recv";
    case StepKind::kRecvReduce: return "recv-reduce";
    case StepKind::kRecvReduceSend: return "recv-reduce-send";
    case StepKind::kRecvReduceCopySend: return "recv-reduce-copy-send";
    case StepKind::kRecvCopySend: return "recv-copy-send";
    case StepKind::kLocalCopy: return "local copy";
    case StepKind::kLocalReduce: return "local reduce";
    case StepKind::kFence: return "fence";
    case StepKind::kPull: return "pull";
    case StepKind::kPullReduce: return "pull-reduce";
    case StepKind::kAckPull: return "ack-pull";
    case StepKind::kAwaitPull: return "await-pull";
    case StepKind::kPublish: return "publish";
  }
  return "?";
}

// "rank 2 step 5 (recv-reduce-send of 96 bytes from rank 1 to rank 3)"
std::string at(int rank, size_t i, const Step& s) {
  std::string d = step_name(s.kind);
  if (s.kind != StepKind::kFence && s.kind != StepKind::kAckPull && s.kind != StepKind::kAwaitPull) {
    d += " of " + str(s.nbytes) + " bytes";
  }
  if (uses_recv(s.kind) || is_pull(s.kind)) {
    if (s.recv_peer >= 0) d += " from rank " + std::to_string(s.recv_peer);
  }
  if (uses_send(s.kind) || s.kind == StepKind::kAckPull) {
    if (s.send_peer >= 0) d += " to rank " + std::to_string(s.send_peer);
  }
  return "rank " + std::to_string(rank) + " step " + str(i) + " (" + d + ")";
}

bool reads_src(StepKind k) {
  return k == StepKind::kSend || k == StepKind::kRecvReduce || k == StepKind::kRecvReduceSend ||
         k == StepKind::kRecvReduceCopySend || k == StepKind::kLocalCopy || k == StepKind::kLocalReduce ||
         k == StepKind::kPullReduce;
}
bool writes_dst(StepKind k) {
  return k == StepKind::kRecv || k == StepKind::kRecvReduce || k == StepKind::kRecvReduceCopySend ||
         k == StepKind::kRecvCopySend || k == StepKind::kLocalCopy || k == StepKind::kLocalReduce ||
         k == StepKind::kPull || k == StepKind::kPullReduce || k == StepKind::kPublish;
}
bool reduces(StepKind k) {
  return k == StepKind::kRecvReduce || k == StepKind::kRecvReduceSend || k == StepKind::kRecvReduceCopySend ||
         k == StepKind::kLocalReduce || k == StepKind::kPullReduce;
}
// Steps that move messages through FIFOs.
bool uses_fifo(StepKind k) { return !is_local(k) && !is_pull(k); }

// One buffer of a rank. The call's buffers sit at fake addresses (rank r's
// in [(r+1) << 40, (r+2) << 40)), never read or written: only the address
// table is real memory (publish steps write this rank's address into it).
// Steps name buffers by id (algo/step.h); the checker resolves them against
// the rank's PlanBuffers, as an executor does.
struct Region {
  const char* name;
  const char* begin;
  size_t bytes;
  bool writable;
};

// An address table entry no address has arrived in.
constexpr uint64_t kNoAddress = ~uint64_t(0);

struct RankPlan {
  Schedule steps;
  PlanBuffers bufs;
  std::vector<uint64_t> addrs;
  std::vector<Region> regions;
  ScheduleFamily family = kFamilyFifo;
  bool self_checked = false;  // a rooted call planned to need no agreement rounds
};

const Region* region_of(const RankPlan& p, const char* ptr) {
  for (const Region& g : p.regions) {
    if (ptr >= g.begin && ptr < g.begin + g.bytes) return &g;
  }
  return nullptr;
}

// "out+88"
std::string where(const RankPlan& p, const char* ptr) {
  const Region* g = region_of(p, ptr);
  if (!g) return "an address outside the rank's buffers";
  return std::string(g->name) + "+" + str(static_cast<size_t>(ptr - g->begin));
}

// Empty when [ptr, ptr + n) lies in one of the rank's buffers (a writable
// one when `write`), else what is wrong.
std::string range_fault(const RankPlan& p, const char* ptr, size_t n, bool write) {
  if (!ptr) return "is null";
  const Region* g = region_of(p, ptr);
  if (!g) return "points outside the rank's buffers";
  const size_t off = static_cast<size_t>(ptr - g->begin);
  if (n > g->bytes - off) {
    return "runs past the end of " + std::string(g->name) + " (" + str(n) + " bytes at " + g->name + "+" +
           str(off) + ", which holds " + str(g->bytes) + ")";
  }
  if (write && !g->writable) return "writes into " + std::string(g->name) + ", the call's input";
  return {};
}

// Bytes of the call's input and output on every rank (as the communicator
// validates them; CallPlan::count says which one `count` is).
bool has_input(OpKind k) {
  return k == OpKind::kReduceScatter || k == OpKind::kScatter || k == OpKind::kAllGather || k == OpKind::kGather ||
         k == OpKind::kAllToAll;
}

void buffer_bytes(const PlanCheckCall& c, size_t* in, size_t* out) {
  call_buffer_bytes(c.kind, c.count, c.elem, c.world, in, out);
}

void validate(const PlanCheckCall& c) {
  if (c.world < 1) throw ValueError("check_plan: world must be at least 1, got " + std::to_string(c.world));
  if (c.elem < 1) throw ValueError("check_plan: the element size must be at least 1 byte");
  if (c.slot_bytes < 1 || c.nslots < 1) throw ValueError("check_plan: FIFOs need at least one slot of one byte");
  if (c.kind == OpKind::kSend || static_cast<int>(c.kind) < 1 || static_cast<int>(c.kind) >= kNumOpKinds) {
    throw ValueError("check_plan: not a collective");
  }
  // The call's own rules are the communicators' (comm/call_check.h), on
  // every rank's buffers as the plan checker lays them out.
  size_t in_bytes = 0, out_bytes = 0;
  buffer_bytes(c, &in_bytes, &out_bytes);
  for (int r = 0; r < c.world; ++r) {
    auto buffer = [&](size_t bytes, uintptr_t at) {
      Buffer b;
      b.ptr = reinterpret_cast<char*>(at);
      b.dtype = DataType::kUInt8;
      b.count = bytes / c.elem;  // elements, as the call counts them (one byte each here)
      b.present = true;
      return b;
    };
    const size_t base = size_t{1} << 40;
    Buffer out = buffer(out_bytes, base), in = has_input(c.kind) ? buffer(in_bytes, base << 1) : Buffer{};
    try {
      check_call(describe_call(c.kind, r, c.world, out, in, c.root, ReduceOp::kSum));
    } catch (const ValueError& e) {
      throw ValueError(std::string("check_plan: ") + e.what());
    }
  }
  if (!c.ring.empty()) {
    std::vector<char> seen(c.world, 0);
    bool ok = static_cast<int>(c.ring.size()) == c.world;
    for (size_t i = 0; ok && i < c.ring.size(); ++i) {
      const int r = c.ring[i];
      ok = r >= 0 && r < c.world && !seen[r];
      if (ok) seen[r] = 1;
    }
    if (!ok) throw ValueError("check_plan: the ring order is not a permutation of the world's ranks");
  }
  if (!c.hosts.empty() && static_cast<int>(c.hosts.size()) != c.world) {
    throw ValueError("check_plan: " + std::to_string(c.hosts.size()) + " host labels for a world of " +
                     std::to_string(c.world));
  }
  if (c.device && c.algo == Algo::kPull) throw ValueError("check_plan: the device executor runs no pull schedules");
}

// Every rank's schedule, planned as the communicator plans it.
std::vector<RankPlan> plan_all(const PlanCheckCall& c) {
  const int n = c.world;
  size_t in_bytes, out_bytes;
  buffer_bytes(c, &in_bytes, &out_bytes);
  const size_t slice = c.slice_elems ? c.slice_elems : ring_slice_elems(c.slot_bytes, c.nslots, c.elem);
  std::vector<RankPlan> plans(n);
  const Topology topo = Topology::from_hosts(c.hosts.empty() ? std::vector<int>(n, 0) : c.hosts);
  for (int r = 0; r < n; ++r) {
    RankPlan& p = plans[r];
    p.addrs.assign(n, kNoAddress);
    AddressedCall call;
    call.kind = c.kind;
    call.count = c.count;
    call.root = c.root;
    call.avg = c.avg;
    call.algo = c.algo;
    const uintptr_t base = (static_cast<uintptr_t>(r) + 1) << 40;
    auto fake = [&](int k) { return reinterpret_cast<char*>(base + (static_cast<uintptr_t>(k) << 37)); };
    call.out = fake(0);
    call.in = has_input(c.kind) ? fake(1) : nullptr;
    call.scratch = fake(2);
    p.regions = {{"out", call.out, out_bytes, true},
                 {"in", call.in, in_bytes, false},
                 {"scratch", call.scratch, scratch_bytes(plan_of(call, c.elem, n), c.elem, n), true},
                 {"addrs", reinterpret_cast<const char*>(p.addrs.data()), n * sizeof(uint64_t), true},
                 {"agreement", fake(3), 4 * sizeof(uint64_t), true}};
    p.bufs = buffers_of(call);
    p.bufs.base[kAddrs] = reinterpret_cast<char*>(p.addrs.data());
    p.bufs.base[kState] = fake(3);
    PlanContext ctx{r, n, c.elem, slice, &p.steps};
    ctx.topo = &topo;
    if (!c.ring.empty()) {
      ctx.ring = c.ring.data();
      ctx.ring_pos = static_cast<int>(std::find(c.ring.begin(), c.ring.end(), r) - c.ring.begin());
    }
    // The CPU communicator plans rooted calls to check themselves where they
    // can (comm/call_plan.h plan_checks_itself) and runs Communicator::
    // agree_on_call's rounds (each ends in a fence) before the others' steps:
    // the same as running them first in one schedule.
    ctx.mutual_pair = c.agreement && !c.device && wants_mutual_pair(n, true);
    ctx.covering = c.agreement && !c.device && wants_covering(n, true);
    Schedule call_steps;
    ctx.out = &call_steps;
    p.family = plan_call(ctx, plan_of(call, c.elem, n));  // the barrier too, as Communicator::plan
    ctx.out = &p.steps;
    p.self_checked = c.agreement && !c.device && is_rooted(c.kind) && plan_checks_itself(n, true, c.kind, p.family);
    if (c.agreement && is_rooted(c.kind) && n > 1 && !p.self_checked) dissemination_agreement(ctx, {kState, 0});
    const size_t shift = p.steps.size();
    for (Step s : call_steps) {
      if (s.after != SIZE_MAX) s.after += shift;
      p.steps.push_back(s);
    }
  }
  return plans;
}

// Each step alone: peers, `after`, tags and the byte ranges it touches.
void check_steps(const std::vector<RankPlan>& plans, size_t elem) {
  const int n = static_cast<int>(plans.size());
  for (int r = 0; r < n; ++r) {
    const RankPlan& p = plans[r];
    if (p.family != plans[0].family) {
      fault("rank " + std::to_string(r) + " runs schedule family " + std::to_string(p.family) + ", rank 0 family " +
            std::to_string(plans[0].family) + ": all ranks of a call must run the same one");
    }
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const Step& s = p.steps[i];
      const std::string me = at(r, i, s);
      auto peer_fault = [&](int peer, const char* role) {
        if (peer < 0 || peer >= n) fault(me + ": " + role + " rank " + std::to_string(peer) + ", not a rank of world " + std::to_string(n));
        if (peer == r) fault(me + ": " + role + " itself");
      };
      for (const BufRef* b : {&s.dst, &s.src, &s.src2, &s.remote_base}) {
        if (b->buf >= kNumBufs) fault(me + ": names buffer " + std::to_string(b->buf) + ", which no call has");
      }
      if (s.after != SIZE_MAX && s.after >= i) {
        fault(me + ": waits for step " + str(s.after) + ", which does not come before it");
      }
      if (uses_fifo(s.kind)) {
        // The executor receives on every FIFO step with a recv_peer and sends on every one with a send_peer.
        if (uses_recv(s.kind) != (s.recv_peer >= 0)) {
          fault(me + (uses_recv(s.kind) ? ": has no peer to receive from" : ": names a peer to receive from but does not receive"));
        }
        if (uses_send(s.kind) != (s.send_peer >= 0)) {
          fault(me + (uses_send(s.kind) ? ": has no peer to send to" : ": names a peer to send to but does not send"));
        }
        if (uses_recv(s.kind)) peer_fault(s.recv_peer, "receives from");
        if (uses_send(s.kind)) peer_fault(s.send_peer, "sends to");
      } else if (s.kind == StepKind::kAckPull) {
        peer_fault(s.send_peer, "acknowledges to");
      } else if (is_pull(s.kind)) {
        peer_fault(s.recv_peer, s.kind == StepKind::kAwaitPull ? "waits for" : "reads from");
      }
      if (reduces(s.kind) && s.nbytes % elem) {
        fault(me + ": reduces " + str(s.nbytes) + " bytes, not whole elements of " + str(elem));
      }
      if (s.nbytes) {
        std::string why;
        if (reads_src(s.kind) && !(why = range_fault(p, p.bufs.at(s.src), s.nbytes, false)).empty()) {
          fault(me + ": src " + why);
        }
        if (s.kind == StepKind::kLocalReduce && !(why = range_fault(p, p.bufs.at(s.src2), s.nbytes, false)).empty()) {
          fault(me + ": src2 " + why);
        }
        if (writes_dst(s.kind) && !(why = range_fault(p, p.bufs.at(s.dst), s.nbytes, true)).empty()) {
          fault(me + ": dst " + why);
        }
      }
      if (s.kind == StepKind::kPublish) {
        const Region* g = region_of(p, p.bufs.at(s.dst));
        if (s.nbytes != sizeof(uint64_t) || !g || std::strcmp(g->name, "addrs")) {
          fault(me + ": publishes into " + where(p, p.bufs.at(s.dst)) + ", not into the rank's address table");
        }
      }
      if (s.kind == StepKind::kPull || s.kind == StepKind::kPullReduce) {
        const char* rb = p.bufs.at(s.remote_base);
        const Region* g = region_of(p, rb);
        if (!g || std::strcmp(g->name, "addrs") || range_fault(p, rb, sizeof(uint64_t), false).size()) {
          fault(me + ": takes the peer's address from " + where(p, rb) + ", not from the rank's address table");
        }
      }
    }
  }
}

// Every message a rank sends to a peer meets a receive of the same size
// there, in order: steps on one FIFO run in list order, so the k-th sending
// step from a to b is what b's k-th receiving step from a gets.
void check_pairing(const std::vector<RankPlan>& plans) {
  const int n = static_cast<int>(plans.size());
  std::vector<std::vector<size_t>> sends(n * n), recvs(n * n);  // by from * n + to
  for (int r = 0; r < n; ++r) {
    const Schedule& steps = plans[r].steps;
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      if (!uses_fifo(s.kind)) continue;
      if (uses_send(s.kind)) sends[r * n + s.send_peer].push_back(i);
      if (uses_recv(s.kind)) recvs[s.recv_peer * n + r].push_back(i);
    }
  }
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      const std::vector<size_t>& out = sends[a * n + b];
      const std::vector<size_t>& in = recvs[a * n + b];
      const Schedule& sa = plans[a].steps;
      const Schedule& sb = plans[b].steps;
      const size_t common = std::min(out.size(), in.size());
      for (size_t k = 0; k < common; ++k) {
        const Step& s = sa[out[k]];
        const Step& v = sb[in[k]];
        if (s.nbytes != v.nbytes) {
          fault(at(a, out[k], s) + " is message " + str(k + 1) + " from rank " + std::to_string(a) + " to rank " +
                std::to_string(b) + ", which " + at(b, in[k], v) + " receives: " + str(s.nbytes) + " bytes sent, " +
                str(v.nbytes) + " expected");
        }
      }
      if (out.size() > common) {
        fault(at(a, out[common], sa[out[common]]) + " is never received: rank " + std::to_string(b) +
              " receives " + str(in.size()) + " messages from rank " + std::to_string(a) + ", which sends " +
              str(out.size()));
      }
      if (in.size() > common) {
        fault(at(b, in[common], sb[in[common]]) + " never gets a message: rank " + std::to_string(a) + " sends " +
              str(out.size()) + " messages to rank " + std::to_string(b) + ", which receives " + str(in.size()));
      }
    }
  }
}

// All ranks' schedules run together under the executor's ordering rules,
// over FIFOs of bounded depth; data is not moved, except the addresses that
// pull schedules send (the address table is real memory).
class CpuRun {
 public:
  CpuRun(std::vector<RankPlan>& plans, const PlanCheckCall& c)
      : plans_(plans), n_(c.world), slot_(c.slot_bytes), depth_(static_cast<size_t>(c.nslots)),
        fifo_(n_ * n_), acks_(n_ * n_, 0), ranks_(n_),
        must_cover_(c.agreement && is_rooted(c.kind) && n_ > 1) {
    for (int r = 0; r < n_; ++r) {
      Rank& k = ranks_[r];
      k.heard.assign(n_, false);
      k.heard[r] = true;
      const Schedule& steps = plans_[r].steps;
      k.progress.assign(steps.size(), StepProgress{});
      k.busy = FifoMarks(n_);
      // Which of this rank's waits for peer p each await-pull step is (1, 2, ...).
      std::vector<size_t> seen(n_, 0);
      k.await_nth.assign(steps.size(), 0);
      for (size_t i = 0; i < steps.size(); ++i) {
        if (steps[i].kind == StepKind::kAwaitPull) k.await_nth[i] = ++seen[steps[i].recv_peer];
      }
    }
  }

  void run(PlanCheckResult* res) {
    messages_ = &res->messages;
    const size_t window = step_window(n_);
    for (;;) {
      bool moved = false, all = true;
      for (int r = 0; r < n_; ++r) {
        Rank& k = ranks_[r];
        if (finished(r)) continue;
        moved |= ordered_pass(plans_[r].steps, k.progress.data(), &k.first, window, k.busy,
                              [&](size_t i) { return advance(r, i); });
        all = all && finished(r);
      }
      ++res->passes;
      if (all) break;
      // Pulls run only when nothing else can move: the order in which a
      // buffer's owner is likeliest to have moved on before its readers read.
      if (!moved && !pulls_now_) {
        pulls_now_ = true;
        continue;
      }
      if (!moved) fault(deadlock());
      pulls_now_ = false;
    }
    if (must_cover_) check_cover();
    for (int a = 0; a < n_; ++a) {
      for (int b = 0; b < n_; ++b) {
        if (!fifo_[a * n_ + b].empty()) {
          fault("rank " + std::to_string(a) + " left " + str(fifo_[a * n_ + b].size()) +
                " segments unreceived in its FIFO to rank " + std::to_string(b));
        }
      }
    }
  }

 private:
  struct Segment {
    size_t step;          // the sender's step
    uint64_t segment;     // its number within that step
    size_t nbytes;
    const char* payload;  // the sender's memory it came from (sends), else null
    std::vector<bool> heard;  // the ranks the sender had heard from when it sent this
  };
  struct Rank {
    std::vector<StepProgress> progress;
    size_t first = 0;
    FifoMarks busy;
    std::vector<size_t> await_nth;
    // The ranks whose call this rank has seen, directly or through a chain of
    // messages, each header checked against its receiver's call on the way.
    std::vector<bool> heard;
  };

  bool finished(int r) const { return ranks_[r].first >= plans_[r].steps.size(); }
  std::deque<Segment>& fifo(int from, int to) { return fifo_[from * n_ + to]; }

  bool advance(int r, size_t i) {
    const Step& s = plans_[r].steps[i];
    StepProgress& p = ranks_[r].progress[i];
    switch (s.kind) {
      case StepKind::kAckPull:
        ++acks_[r * n_ + s.send_peer];
        p.complete = true;
        return true;
      case StepKind::kAwaitPull:
        p.complete = acks_[s.recv_peer * n_ + r] >= ranks_[r].await_nth[i];
        return p.complete;
      case StepKind::kPull:
      case StepKind::kPullReduce:
        if (!pulls_now_) return false;
        check_pull(r, i, s);
        p.complete = true;
        return true;
      default:
        break;
    }
    if (is_local(s.kind)) {
      // Publishing writes the address table (real memory): where this run's buffer lies.
      if (s.kind == StepKind::kPublish) {
        const uint64_t a = reinterpret_cast<uintptr_t>(plans_[r].bufs.at(s.src));
        std::memcpy(plans_[r].bufs.at(s.dst), &a, sizeof(a));
      }
      p.complete = true;
      return true;
    }
    std::deque<Segment>* in = uses_recv(s.kind) ? &fifo(s.recv_peer, r) : nullptr;
    std::deque<Segment>* out = uses_send(s.kind) ? &fifo(r, s.send_peer) : nullptr;
    bool moved = false;
    while (!p.complete) {
      const size_t n = std::min(slot_, s.nbytes - p.done);
      if (in) {
        if (in->empty()) break;
        const Segment& h = in->front();
        if (h.segment != p.segment || h.nbytes != n) {
          fault(at(r, i, s) + ": expected segment " + str(p.segment) + " of " + str(n) + " bytes, got segment " +
                str(h.segment) + " of " + str(h.nbytes) + " bytes of " +
                at(s.recv_peer, h.step, plans_[s.recv_peer].steps[h.step]));
        }
      }
      if (out && out->size() >= depth_) break;
      if (in) {
        deliver(r, s, p, in->front(), n);
        std::vector<bool>& mine = ranks_[r].heard;
        for (int j = 0; j < n_; ++j) mine[j] = mine[j] || in->front().heard[j];
        in->pop_front();
      }
      if (out) {
        out->push_back({i, p.segment, n, s.kind == StepKind::kSend ? plans_[r].bufs.at(s.src) + p.done : nullptr,
                        ranks_[r].heard});
        ++*messages_;
      }
      p.done += n;
      ++p.segment;
      moved = true;
      if (p.done == s.nbytes) p.complete = true;
    }
    return moved;
  }

  // An address sent from the sender's table into this rank's table arrives
  // (those are real memory); all other data is not moved.
  void deliver(int r, const Step& s, const StepProgress& p, const Segment& h, size_t n) {
    if (!n || !h.payload || !writes_dst(s.kind)) return;
    const Region* from = region_of(plans_[s.recv_peer], h.payload);
    char* const dst = plans_[r].bufs.at(s.dst) + p.done;
    const Region* to = region_of(plans_[r], dst);
    if (from && to && !std::strcmp(from->name, "addrs") && !std::strcmp(to->name, "addrs")) {
      std::memcpy(dst, h.payload, n);
    }
  }

  // A pull reads the peer's buffer where the peer said it is, while the peer
  // still keeps it (a peer that has returned may reuse it).
  void check_pull(int r, size_t i, const Step& s) {
    const int peer = s.recv_peer;
    uint64_t base;
    std::memcpy(&base, plans_[r].bufs.at(s.remote_base), sizeof(base));
    if (base == kNoAddress) fault(at(r, i, s) + ": reads rank " + std::to_string(peer) + "'s buffer before its address arrived");
    if (finished(peer)) {
      fault(at(r, i, s) + ": reads rank " + std::to_string(peer) + "'s buffer after rank " + std::to_string(peer) +
            " has finished the call (nothing makes it wait for this read)");
    }
    if (!s.nbytes) return;
    const char* remote = reinterpret_cast<const char*>(base + s.remote_offset);
    const std::string why = range_fault(plans_[peer], remote, s.nbytes, false);
    if (!why.empty()) fault(at(r, i, s) + ": the range read on rank " + std::to_string(peer) + " " + why);
  }

  // A rooted call with the agreement check: every rank has heard from every
  // other before it finishes (through the agreement's rounds, or the plan's
  // own messages where it checks itself), so ranks that disagree on the call
  // cannot all return.
  void check_cover() const {
    for (int r = 0; r < n_; ++r) {
      for (int j = 0; j < n_; ++j) {
        if (!ranks_[r].heard[j]) {
          fault("rank " + std::to_string(r) + " finishes the rooted call without hearing from rank " +
                std::to_string(j) + " through any chain of checked messages" +
                (plans_[r].self_checked ? " (its plan runs no agreement rounds)" : ""));
        }
      }
    }
  }

  // What each rank that has not finished waits for.
  std::string deadlock() const {
    std::string out = "deadlock: no rank can move";
    int listed = 0;
    for (int r = 0; r < n_ && listed < 6; ++r) {
      if (finished(r)) continue;
      const Rank& k = ranks_[r];
      const Step& s = plans_[r].steps[k.first];
      const StepProgress& p = k.progress[k.first];
      std::string why;
      if (s.after != SIZE_MAX && !k.progress[s.after].complete) {
        why = "waits for step " + str(s.after);

      } else if (s.kind == StepKind::kAwaitPull) {
        why = "waits for rank " + std::to_string(s.recv_peer) + " to say it read this rank's buffer";
      } else if (uses_recv(s.kind) && fifo_[s.recv_peer * n_ + r].empty()) {
        why = "waits for data from rank " + std::to_string(s.recv_peer);
      } else if (uses_send(s.kind)) {
        why = "waits for rank " + std::to_string(s.send_peer) + " to take data (its FIFO holds " + str(depth_) +
              " of " + str(depth_) + " segments)";
      } else {
        why = "cannot move";
      }
      if (uses_fifo(s.kind)) why += ", " + str(p.segment) + " segments moved";
      out += (listed++ ? "; " : ": ") + at(r, k.first, s) + " " + why;
    }
    return out;
  }

  std::vector<RankPlan>& plans_;
  const int n_;
  const size_t slot_, depth_;
  std::vector<std::deque<Segment>> fifo_;  // by from * n + to
  std::vector<size_t> acks_;               // by reader * n + owner: reads acknowledged
  std::vector<Rank> ranks_;
  size_t* messages_ = nullptr;
  bool pulls_now_ = false;  // this sweep runs the pulls that are ready
  const bool must_cover_;
};

// The device executor's translation of each rank's schedule: the groups of
// transfers it would post (kernels are not run).
class RecordingOps : public DeviceOps {
 public:
  RecordingOps(int world, int rank) : world_(world), next_(((static_cast<uintptr_t>(rank) + 1) << 40) + (uintptr_t(3) << 37)) {}
  int world() const override { return world_; }
  void group(const std::vector<P2pOp>& ops) override { groups.push_back(ops); }
  void reduce(DataType, ReduceOp, char*, const char*, const char*, size_t) override {}
  void divide(DataType, char*, size_t, int) override {}
  void copy(char*, const char*, size_t) override {}
  char* alloc_scratch(size_t nbytes) override {
    char* p = reinterpret_cast<char*>(next_);
    next_ += (nbytes + 4095) / 4096 * 4096 + 4096;
    return p;
  }
  void free_scratch(char*) override {}
  std::vector<std::vector<P2pOp>> groups;

 private:
  int world_;
  uintptr_t next_;
};

// Every rank posts its groups one at a time; a group is done once each of
// its transfers met its peer's (pairs match in posting order), the strict
// reading of NCCL's groups that testing/device_sim.h also takes.
void run_device(const std::vector<RankPlan>& plans, const PlanCheckCall& c, PlanCheckResult* res) {
  const int n = c.world;
  std::vector<std::vector<std::vector<P2pOp>>> groups(n);
  for (int r = 0; r < n; ++r) {
    RecordingOps ops(n, r);
    DeviceExecutor ex(c.chunk_bytes);
    ex.run(plans[r].steps, plans[r].bufs, ops, DataType::kUInt8, ReduceOp::kSum);
    groups[r] = std::move(ops.groups);
  }
  struct Posted {
    int rank;
    size_t op;
  };
  std::vector<std::deque<Posted>> sends(n * n), recvs(n * n);  // by from * n + to
  std::vector<size_t> current(n, 0), left(n, 0);
  std::vector<char> posted(n, 0);
  for (;;) {
    bool moved = false, all = true;
    for (int r = 0; r < n; ++r) {
      if (posted[r] || current[r] >= groups[r].size()) continue;
      const std::vector<P2pOp>& g = groups[r][current[r]];
      for (size_t k = 0; k < g.size(); ++k) {
        if (g[k].peer < 0 || g[k].peer >= n || g[k].peer == r) {
          fault("rank " + std::to_string(r) + " device group " + str(current[r]) + " has a transfer with rank " +
                std::to_string(g[k].peer));
        }
        (g[k].send ? sends[r * n + g[k].peer] : recvs[g[k].peer * n + r]).push_back({r, k});
        if (g[k].send) ++res->messages;
      }
      posted[r] = 1;
      left[r] = g.size();
      moved = true;
    }
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        std::deque<Posted>& s = sends[a * n + b];
        std::deque<Posted>& v = recvs[a * n + b];
        while (!s.empty() && !v.empty()) {
          const P2pOp& so = groups[a][current[a]][s.front().op];
          const P2pOp& vo = groups[b][current[b]][v.front().op];
          if (so.nbytes != vo.nbytes) {
            fault("rank " + std::to_string(a) + " device group " + str(current[a]) + " sends " + str(so.nbytes) +
                  " bytes to rank " + std::to_string(b) + ", whose group " + str(current[b]) + " receives " +
                  str(vo.nbytes) + " bytes there");
          }
          --left[a];
          --left[b];
          s.pop_front();
          v.pop_front();
          moved = true;
        }
      }
    }
    for (int r = 0; r < n; ++r) {
      if (posted[r] && left[r] == 0) {
        posted[r] = 0;
        ++current[r];
        moved = true;
      }
      all = all && current[r] >= groups[r].size();
    }
    ++res->passes;
    if (all) return;
    if (!moved) {
      std::string out = "device deadlock: no group can complete";
      int listed = 0;
      for (int r = 0; r < n && listed < 6; ++r) {
        if (current[r] >= groups[r].size()) continue;
        out += (listed++ ? "; " : ": ") + std::string("rank ") + std::to_string(r) + " waits in group " +
               str(current[r]) + " of " + str(groups[r].size()) + " (" + str(left[r]) + " of " +
               str(groups[r][current[r]].size()) + " transfers unmatched)";
      }
      fault(out);
    }
  }
}

}  // namespace

PlanCheckResult check_plan(const PlanCheckCall& call, const PlanTamper& tamper) {
  validate(call);
  PlanCheckResult res;
  std::vector<RankPlan> plans = plan_all(call);
  res.family = plans[0].family;
  if (tamper) {
    for (int r = 0; r < call.world; ++r) tamper(r, plans[r].steps);
  }
  for (const RankPlan& p : plans) res.steps += p.steps.size();
  try {
    check_steps(plans, call.elem);
    check_pairing(plans);
    if (call.device) {
      run_device(plans, call, &res);
    } else {
      CpuRun(plans, call).run(&res);
    }
  } catch (const PlanFault& f) {
    res.error = f.what;
  }
  return res;
}

}  // namespace ringcomm
