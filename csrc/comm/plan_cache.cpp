#include "comm/plan_cache.h"

#include <algorithm>
#include <exception>

namespace ringcomm {
namespace {

// Symbolic buffer k (1 out, 2 in, 3 scratch) sits at k << kRegionBits, and a
// pointer belongs to the region whose base is nearest: offsets of up to
// +-2^43 bytes either way (an in-place input may start before the output).
// Region 0 holds what was computed from a null buffer (a rooted call's
// absent side), kept as it is: planned afresh it is the same small number.
constexpr int kRegionBits = 44;
constexpr uintptr_t kHalfRegion = uintptr_t{1} << (kRegionBits - 1);
enum Region : unsigned { kNull = 0, kOut = 1, kIn = 2, kScratch = 3, kRegions = 4 };
// Buffers at least this large are planned afresh (their offsets could leave the region).
constexpr size_t kMaxBufferBytes = size_t{1} << (kRegionBits - 2);

constexpr uint8_t kHasOut = 1, kHasIn = 2, kAliased = 4;
// Kept steps carry this for the call's header (never read: re-based first).
const MsgTag* const kSymbolicTag = reinterpret_cast<const MsgTag*>(uintptr_t{kRegions} << kRegionBits);
// What the address table holds for a symbolic plan, to see that it wrote nothing.
constexpr uint64_t kUntouched = 0x5ca1ab1e5ca1ab1eull;

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }
char* symbolic(Region k) { return reinterpret_cast<char*>(uintptr_t{k} << kRegionBits); }
unsigned region_of(uintptr_t v) { return static_cast<unsigned>((v + kHalfRegion) >> kRegionBits); }

bool overlaps(uintptr_t a, size_t na, uintptr_t b, size_t nb) {
  return na && nb && a < b + nb && b < a + na;
}

// Whether every pointer of `s` is one a re-base can move: in a buffer's
// region (or computed from a null one), its header the call's, no address
// table.
bool relocatable(const Step& s, const MsgTag* tag) {
  for (const void* p : {static_cast<const void*>(s.dst), static_cast<const void*>(s.src),
                        static_cast<const void*>(s.src2)}) {
    if (region_of(addr(p)) >= kRegions) return false;
  }
  return (s.tag == nullptr || s.tag == tag) && s.remote_base == nullptr;
}

// Where each region's pointers go for `call` (the input's region is empty
// when it overlaps the output: its pointers sit in the output's).
struct Bases {
  uintptr_t at[kRegions];
  template <class T>
  T* move(T* p) const {
    const uintptr_t v = addr(p);
    const unsigned k = region_of(v);
    if (k == kNull) return p;
    return reinterpret_cast<T*>(at[k] + (v - (uintptr_t{k} << kRegionBits)));
  }
};

Bases bases_of(const CallPlan& call) { return {{0, addr(call.out), addr(call.in), addr(call.scratch)}}; }

// Step `s` of a kept plan for the call whose header is `tag`, appended after `shift` steps.
Step rebased(const Step& s, const Bases& b, const MsgTag* tag, size_t shift) {
  Step r = s;
  r.dst = b.move(s.dst);
  r.src = b.move(s.src);
  r.src2 = b.move(s.src2);
  if (s.tag) r.tag = tag;
  if (s.after != SIZE_MAX) r.after = s.after + shift;
  return r;
}

}  // namespace

bool PlanCache::Key::operator==(const Key& o) const {
  return kind == o.kind && algo == o.algo && avg == o.avg && buffers == o.buffers && root == o.root &&
         count == o.count && elem == o.elem && slice_elems == o.slice_elems && alias == o.alias;
}

size_t PlanCache::KeyHash::operator()(const Key& k) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t x : {uint64_t(k.kind), uint64_t(k.algo), uint64_t(k.avg), uint64_t(k.buffers),
                     uint64_t(uint32_t(k.root)), uint64_t(k.count), uint64_t(k.elem), uint64_t(k.slice_elems),
                     uint64_t(k.alias)}) {
    h = (h ^ x) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  return static_cast<size_t>(h);
}

bool PlanCache::Context::operator==(const Context& o) const {
  return rank == o.rank && world == o.world && ring_pos == o.ring_pos && ring == o.ring && topo == o.topo;
}

PlanCache::PlanCache(size_t capacity, size_t max_steps) : capacity_(capacity), max_steps_(max_steps) {}

void PlanCache::clear() {
  lru_.clear();
  index_.clear();
  held_steps_ = 0;
  entries_.store(0, std::memory_order_relaxed);
  steps_.store(0, std::memory_order_relaxed);
}

PlanCacheStats PlanCache::stats() const {
  PlanCacheStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.uncached = uncached_.load(std::memory_order_relaxed);
  s.evictions = evictions_.load(std::memory_order_relaxed);
  s.entries = entries_.load(std::memory_order_relaxed);
  s.steps = steps_.load(std::memory_order_relaxed);
  s.capacity = capacity_;
  return s;
}

ScheduleFamily PlanCache::plan(const PlanContext& c, const CallPlan& call) {
  if (capacity_ == 0) return plan_call(c, call);
  size_t in_bytes, out_bytes;
  call_buffer_bytes(call.kind, call.count, c.elem, c.world, &in_bytes, &out_bytes);
  const size_t scratch = scratch_bytes(call, c.elem, c.world);
  if (call.algo == Algo::kPull || c.members || std::max({in_bytes, out_bytes, scratch}) >= kMaxBufferBytes) {
    uncached_.fetch_add(1, std::memory_order_relaxed);
    return plan_call(c, call);
  }
  const Context now{c.rank, c.world, c.ring ? c.ring_pos : 0, c.ring, c.topo};
  if (!(now == context_)) {
    clear();
    context_ = now;
  }
  Key key{call.kind, call.algo, call.avg, 0, call.root, call.count, c.elem, c.slice_elems, 0};
  if (call.out) key.buffers |= kHasOut;
  if (call.in) key.buffers |= kHasIn;
  if (call.out && call.in && overlaps(addr(call.out), out_bytes, addr(call.in), in_bytes)) {
    key.buffers |= kAliased;
    key.alias = static_cast<int64_t>(addr(call.in) - addr(call.out));
  }
  const auto it = index_.find(key);
  if (it == index_.end()) return build(c, call, key).family;
  lru_.splice(lru_.begin(), lru_, it->second);
  const Entry& e = *it->second;
  if (!e.kept) {
    uncached_.fetch_add(1, std::memory_order_relaxed);
    return plan_call(c, call);
  }
  rebase(e, c, call);
  hits_.fetch_add(1, std::memory_order_relaxed);
  return e.family;
}

void PlanCache::rebase(const Entry& e, const PlanContext& c, const CallPlan& call) const {
  const Bases b = bases_of(call);
  const size_t shift = c.out->size();
  c.out->reserve(shift + e.steps.size());
  for (const Step& s : e.steps) c.out->push_back(rebased(s, b, c.tag, shift));
}

// A miss runs the plan built with the call's own buffers (as without a
// cache) and keeps the symbolic one only if, re-based onto those buffers, it
// is that plan step for step.
PlanCache::Entry& PlanCache::build(const PlanContext& c, const CallPlan& call, const Key& key) {
  const size_t shift = c.out->size();
  const ScheduleFamily family = plan_call(c, call);

  Entry e;
  e.key = key;
  CallPlan sym = call;
  sym.out = call.out ? symbolic(kOut) : nullptr;
  sym.in = !call.in ? nullptr : (key.buffers & kAliased) ? sym.out + key.alias : symbolic(kIn);
  sym.scratch = symbolic(kScratch);
  addrs_.assign(static_cast<size_t>(c.world), kUntouched);
  PlanContext sc = c;
  sc.out = &e.steps;
  sc.addrs = addrs_.data();
  bool ok = true;
  try {
    e.family = plan_call(sc, sym);
  } catch (const std::exception&) {
    ok = false;  // the call runs its fresh plan; the cache only keeps none
  }

  ok = ok && e.family == family && e.steps.size() == c.out->size() - shift && e.steps.size() <= max_steps_ &&
            std::all_of(addrs_.begin(), addrs_.end(), [](uint64_t a) { return a == kUntouched; });
  const Bases b = bases_of(call);
  for (size_t i = 0; ok && i < e.steps.size(); ++i) {
    ok = relocatable(e.steps[i], c.tag) && rebased(e.steps[i], b, c.tag, shift) == (*c.out)[shift + i];
  }
  if (ok) {
    for (Step& s : e.steps) {
      if (s.tag) s.tag = kSymbolicTag;
    }
  } else {
    Schedule().swap(e.steps);
  }
  e.kept = ok;
  (ok ? misses_ : uncached_).fetch_add(1, std::memory_order_relaxed);
  evict_for(e.steps.size());
  held_steps_ += e.steps.size();
  lru_.push_front(std::move(e));
  index_[key] = lru_.begin();
  entries_.store(lru_.size(), std::memory_order_relaxed);
  steps_.store(held_steps_, std::memory_order_relaxed);
  return lru_.front();
}

// Drops the least recently used plans until one more of `steps` steps fits.
void PlanCache::evict_for(size_t steps) {
  while (!lru_.empty() && (lru_.size() >= capacity_ || held_steps_ + steps > max_steps_)) {
    held_steps_ -= lru_.back().steps.size();
    index_.erase(lru_.back().key);
    lru_.pop_back();
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace ringcomm
