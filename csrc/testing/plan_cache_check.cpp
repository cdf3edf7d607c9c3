#include "testing/plan_cache_check.h"

#include <algorithm>
#include <cstdio>

#include "ringcomm/types.h"

namespace ringcomm {
namespace {

std::string str(size_t v) { return std::to_string(v); }

std::string hex(const void* p) {
  char b[24];
  std::snprintf(b, sizeof b, "%#llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return b;
}

// "out+64" for an address in one of the call's buffers, else its value.
std::string where(const CallPlan& c, size_t in_bytes, size_t out_bytes, size_t scratch_bytes, const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  const struct {
    const char* name;
    const void* base;
    size_t bytes;
  } bufs[] = {{"out", c.out, out_bytes}, {"in", c.in, in_bytes}, {"scratch", c.scratch, scratch_bytes}};
  for (const auto& b : bufs) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(b.base);
    if (b.base && v >= lo && v <= lo + b.bytes) return std::string(b.name) + "+" + str(v - lo);
  }
  return hex(p);
}

}  // namespace

PlanCacheChecker::PlanCacheChecker(int rank, int world, size_t capacity, size_t max_steps, std::vector<int> ring,
                                   std::vector<int> hosts, size_t slice_elems)
    : rank_(rank),
      world_(world),
      slice_elems_(slice_elems),
      ring_(std::move(ring)),
      topo_(Topology::from_hosts(hosts.empty() ? std::vector<int>(std::max(world, 1), 0) : hosts)),
      cache_(capacity, max_steps),
      addrs_(static_cast<size_t>(std::max(world, 1))) {
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
  if (k.kind == OpKind::kSend || k.kind == OpKind::kBarrier || static_cast<int>(k.kind) < 1 ||
      static_cast<int>(k.kind) >= kNumOpKinds) {
    throw ValueError("plan cache check: not a collective the cache plans");
  }
  if (is_rooted(k.kind) && (k.root < 0 || k.root >= world_)) {
    throw ValueError("plan cache check: root " + std::to_string(k.root) + " out of range for world " +
                     std::to_string(world_));
  }
  if (k.elem < 1) throw ValueError("plan cache check: the element size must be at least 1 byte");
  size_t in_bytes, out_bytes;
  call_buffer_bytes(k.kind, k.count, k.elem, world_, &in_bytes, &out_bytes);
  CallPlan call;
  call.kind = k.kind;
  call.algo = k.algo;
  call.count = k.count;
  call.root = k.root;
  call.avg = k.avg;
  call.out = reinterpret_cast<char*>(k.out);
  call.in = reinterpret_cast<const char*>(k.in);
  call.scratch = reinterpret_cast<char*>(k.scratch);
  const size_t block = static_cast<size_t>(rank_) * std::min(in_bytes, out_bytes);
  if (k.in_place) {
    switch (k.kind) {
      case OpKind::kReduceScatter:
      case OpKind::kScatter:
        if (!call.in) throw ValueError("plan cache check: an in-place call needs its input");
        call.out = const_cast<char*>(call.in) + block;
        break;
      case OpKind::kAllGather:
      case OpKind::kGather:
        if (!call.out) throw ValueError("plan cache check: an in-place call needs its output");
        call.in = call.out + block;
        break;
      default: throw ValueError("plan cache check: only reduce_scatter, scatter, all_gather and gather have an in-place form");
    }
  }
  MsgTag& tag = tags_[calls_++ % 2];
  tag = MsgTag{};
  tag.kind = static_cast<uint8_t>(k.kind);
  tag.root = k.root;
  tag.seq = calls_;
  tag.count = k.count;

  auto context = [&](Schedule* out) {
    PlanContext c{rank_, world_, k.elem, slice_elems_, &tag, out, addrs_.data()};
    c.topo = &topo_;
    if (!ring_.empty()) {
      c.ring = ring_.data();
      c.ring_pos = ring_pos_;
    }
    return c;
  };
  const Step filler = [&] {
    Step s{};
    s.kind = StepKind::kFence;
    s.tag = &tag;
    return s;
  }();
  Schedule fresh(k.prefix, filler), cached(k.prefix, filler);
  const ScheduleFamily fresh_family = plan_call(context(&fresh), call);
  const PlanCacheStats before = cache_.stats();
  const ScheduleFamily family = cache_.plan(context(&cached), call);
  const PlanCacheStats after = cache_.stats();
  if (tamper) tamper(cached);

  CacheCheckResult r;
  r.family = family;
  r.steps = cached.size() - std::min(cached.size(), k.prefix);
  r.hit = after.hits > before.hits;
  r.kept = r.hit || after.misses > before.misses;
  const size_t scratch = scratch_bytes(call, k.elem, world_);
  auto at = [&](const void* p) { return where(call, in_bytes, out_bytes, scratch, p); };
  if (family != fresh_family) {
    r.mismatch = "family " + std::to_string(family) + " from the cache, " + std::to_string(fresh_family) + " planned afresh";
    return r;
  }
  if (cached.size() != fresh.size()) {
    r.mismatch = str(cached.size() - k.prefix) + " steps from the cache, " + str(fresh.size() - k.prefix) +
                 " planned afresh";
    return r;
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    const Step& a = cached[i];
    const Step& b = fresh[i];
    if (a == b) continue;
    std::string what;
    auto field = [&](const char* name, const std::string& x, const std::string& y) {
      if (what.empty() && x != y) what = std::string(name) + " is " + x + " in the cached plan, " + y + " planned afresh";
    };
    field("kind", std::to_string(static_cast<int>(a.kind)), std::to_string(static_cast<int>(b.kind)));
    field("divide", std::to_string(a.divide), std::to_string(b.divide));
    field("recv_peer", std::to_string(a.recv_peer), std::to_string(b.recv_peer));
    field("send_peer", std::to_string(a.send_peer), std::to_string(b.send_peer));
    field("dst", at(a.dst), at(b.dst));
    field("src", at(a.src), at(b.src));
    field("src2", at(a.src2), at(b.src2));
    field("nbytes", str(a.nbytes), str(b.nbytes));
    field("tag", a.tag == &tag ? "the call's header" : hex(a.tag), b.tag == &tag ? "the call's header" : hex(b.tag));
    field("remote_base", hex(a.remote_base), hex(b.remote_base));
    field("remote_offset", str(a.remote_offset), str(b.remote_offset));
    field("after", a.after == SIZE_MAX ? "none" : str(a.after), b.after == SIZE_MAX ? "none" : str(b.after));
    r.mismatch = "step " + str(i) + ": " + what;
    return r;
  }
  return r;
}

}  // namespace ringcomm
