#include "comm/plan_cache.h"

#include "comm/executor.h"

namespace ringcomm {

size_t PlanCache::KeyHash::operator()(const Key& k) const {
  const CallPlan& c = k.call;
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t x : {uint64_t(c.kind) | uint64_t(c.algo) << 8 | uint64_t(c.avg) << 16 | uint64_t(c.out.buf) << 24 |
                         uint64_t(c.in.buf) << 32 | uint64_t(c.scratch.buf) << 40,
                     c.out.offset, c.in.offset, c.scratch.offset, uint64_t(uint32_t(c.root)), uint64_t(c.count),
                     uint64_t(k.elem), uint64_t(k.slice_elems)}) {
    h = (h ^ x) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  return static_cast<size_t>(h);
}

bool PlanCache::Context::operator==(const Context& o) const {
  return rank == o.rank && world == o.world && ring_pos == o.ring_pos && ring == o.ring && topo == o.topo &&
         members == o.members;
}

PlanCache::PlanCache(size_t capacity, size_t max_steps) : capacity_(capacity), max_steps_(max_steps) {}

void PlanCache::clear() {
  ++generation_;
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

const Plan& PlanCache::plan(const PlanContext& c, const CallPlan& call) {
  if (capacity_ == 0) {
    fresh_.steps.clear();
    PlanContext pc = c;
    pc.out = &fresh_.steps;
    fresh_.family = plan_call(pc, call);
    fresh_.flat = Executor::flat_shape(fresh_.steps);
    return fresh_;
  }
  const Context now{c.rank, c.world, c.ring ? c.ring_pos : 0, c.ring, c.topo, c.members};
  if (!(now == context_)) {
    clear();
    context_ = now;
  }
  const Key key{call, c.elem, c.slice_elems};
  // A loop repeating one call finds it first, without hashing.
  if (!lru_.empty() && lru_.front().key == key) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return lru_.front().plan;
  }
  const auto it = index_.find(key);
  if (it == index_.end()) return build(c, key);
  lru_.splice(lru_.begin(), lru_, it->second);
  hits_.fetch_add(1, std::memory_order_relaxed);
  return lru_.front().plan;
}

const Plan& PlanCache::build(const PlanContext& c, const Key& key) {
  Entry e{key, {}};
  PlanContext pc = c;
  pc.out = &e.plan.steps;
  e.plan.family = plan_call(pc, key.call);
  e.plan.flat = Executor::flat_shape(e.plan.steps);
  if (e.plan.steps.size() > max_steps_) {
    uncached_.fetch_add(1, std::memory_order_relaxed);
    fresh_ = std::move(e.plan);
    return fresh_;
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  e.plan.steps.shrink_to_fit();
  evict_for(e.plan.steps.size());
  held_steps_ += e.plan.steps.size();
  lru_.push_front(std::move(e));
  index_[key] = lru_.begin();
  entries_.store(lru_.size(), std::memory_order_relaxed);
  steps_.store(held_steps_, std::memory_order_relaxed);
  return lru_.front().plan;
}

// Drops the least recently used plans until one more of `steps` steps fits.
void PlanCache::evict_for(size_t steps) {
  while (!lru_.empty() && (lru_.size() >= capacity_ || held_steps_ + steps > max_steps_)) {
    ++generation_;
    held_steps_ -= lru_.back().plan.steps.size();
    index_.erase(lru_.back().key);
    lru_.pop_back();
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace ringcomm
