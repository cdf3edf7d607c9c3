#include "testing/plan_cache_check.h"

#include <algorithm>
#include <cstdio>

#include "ringcomm/types.h"

namespace ringcomm {
namespace {

std::string str(size_t v) { return std::to_string(v); }

const char* buf_name(uint8_t b) {
  switch (b) {
    case kNone: return "none";
    case kOut: return "out";
    case kIn: return "in";
    case kScratch: return "scratch";
    case kState: return "state";
    case kAddrs: return "addrs";
    default: return "?";
  }
}

// "out+64"
std::string where(BufRef r) { return std::string(buf_name(r.buf)) + "+" + str(r.offset); }

}  // namespace

PlanCacheChecker::PlanCacheChecker(int rank, int world, size_t capacity, size_t max_steps, std::vector<int> ring,
                                   std::vector<int> hosts, size_t slice_elems)
    : rank_(rank),
      world_(world),
      slice_elems_(slice_elems),
      ring_(std::move(ring)),
      topo_(Topology::from_hosts(hosts.empty() ? std::vector<int>(std::max(world, 1), 0) : hosts)),
      cache_(capacity, max_steps) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw ValueError("plan cache check: rank " + std::to_string(rank) + " of world " + std::to_string(world));
  }
  if (slice_elems < 1) throw ValueError("plan cache check: slice_elems must be at least 1");
  if (!hosts.empty() && static_cast<int>(hosts.size()) != world) {
    throw ValueError("plan cache check: " + str(hosts.size()) + " host labels for a world of " + std::to_string(world));
  }
  if (!ring_.empty()) {
    std::vector<int> sorted = ring_;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < world; ++i) {
      if (static_cast<int>(sorted.size()) != world || sorted[i] != i) {
        throw ValueError("plan cache check: the ring order is not a permutation of the world's ranks");
      }
    }
    ring_pos_ = static_cast<int>(std::find(ring_.begin(), ring_.end(), rank) - ring_.begin());
  }
}

CacheCheckResult PlanCacheChecker::plan(const CacheCheckCall& k, const std::function<void(Schedule&)>& tamper) {
  if (k.kind == OpKind::kSend || static_cast<int>(k.kind) < 0 || static_cast<int>(k.kind) >= kNumOpKinds) {
    throw ValueError("plan cache check: not a call the cache plans");
  }
  if (is_rooted(k.kind) && (k.root < 0 || k.root >= world_)) {
    throw ValueError("plan cache check: root " + std::to_string(k.root) + " out of range for world " +
                     std::to_string(world_));
  }
  if (k.elem < 1) throw ValueError("plan cache check: the element size must be at least 1 byte");
  size_t in_bytes, out_bytes;
  call_buffer_bytes(k.kind, k.count, k.elem, world_, &in_bytes, &out_bytes);
  // The buffers as the communicator would pass them (call_buffers decides
  // the form from the addresses): far apart, or the in-place block.
  AddressedCall a;
  a.kind = k.kind;
  a.algo = k.algo;
  a.count = k.count;
  a.root = k.root;
  a.avg = k.avg;
  char* const base = reinterpret_cast<char*>(uintptr_t{1} << 44);
  a.out = k.has_out ? base : nullptr;
  a.in = k.has_in ? base + (uintptr_t{1} << 42) : nullptr;
  const size_t block = static_cast<size_t>(rank_) * std::min(in_bytes, out_bytes);
  if (k.in_place) {
    switch (k.kind) {
      case OpKind::kReduceScatter:
      case OpKind::kScatter:
        if (!a.in) throw ValueError("plan cache check: an in-place call needs its input");
        a.out = const_cast<char*>(a.in) + block;
        break;
      case OpKind::kAllGather:
      case OpKind::kGather:
        if (!a.out) throw ValueError("plan cache check: an in-place call needs its output");
        a.in = a.out + block;
        break;
      default: throw ValueError("plan cache check: only reduce_scatter, scatter, all_gather and gather have an in-place form");
    }
  }
  const CallPlan call = plan_of(a, k.elem, world_);

  PlanContext c{rank_, world_, k.elem, slice_elems_, nullptr};
  c.topo = &topo_;
  if (!ring_.empty()) {
    c.ring = ring_.data();
    c.ring_pos = ring_pos_;
  }
  Schedule fresh;
  PlanContext fc = c;
  fc.out = &fresh;
  const ScheduleFamily fresh_family = plan_call(fc, call);
  const PlanCacheStats before = cache_.stats();
  const Plan& kept = cache_.plan(c, call);
  const PlanCacheStats after = cache_.stats();
  Schedule cached = kept.steps;
  if (tamper) tamper(cached);

  CacheCheckResult r;
  r.family = kept.family;
  r.steps = cached.size();
  r.hit = after.hits > before.hits;
  r.kept = r.hit || after.misses > before.misses;
  if (kept.family != fresh_family) {
    r.mismatch = "family " + std::to_string(kept.family) + " from the cache, " + std::to_string(fresh_family) +
                 " planned afresh";
    return r;
  }
  if (cached.size() != fresh.size()) {
    r.mismatch = str(cached.size()) + " steps from the cache, " + str(fresh.size()) + " planned afresh";
    return r;
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    const Step& x = cached[i];
    const Step& y = fresh[i];
    if (x == y) continue;
    std::string what;
    auto field = [&](const char* name, const std::string& u, const std::string& v) {
      if (what.empty() && u != v) what = std::string(name) + " is " + u + " in the cached plan, " + v + " planned afresh";
    };
    field("kind", std::to_string(static_cast<int>(x.kind)), std::to_string(static_cast<int>(y.kind)));
    field("divide", std::to_string(x.divide), std::to_string(y.divide));
    field("recv_peer", std::to_string(x.recv_peer), std::to_string(y.recv_peer));
    field("send_peer", std::to_string(x.send_peer), std::to_string(y.send_peer));
    field("dst", where(x.dst), where(y.dst));
    field("src", where(x.src), where(y.src));
    field("src2", where(x.src2), where(y.src2));
    field("nbytes", str(x.nbytes), str(y.nbytes));
    field("remote_base", where(x.remote_base), where(y.remote_base));
    field("remote_offset", str(x.remote_offset), str(y.remote_offset));
    field("after", x.after == SIZE_MAX ? "none" : str(x.after), y.after == SIZE_MAX ? "none" : str(y.after));
    r.mismatch = "step " + str(i) + ": " + what;
    return r;
  }
  return r;
}

}  // namespace ringcomm
