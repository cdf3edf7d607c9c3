// The plan cache: the plans plan_call built, kept per call signature, so
// that a program repeating its calls (a training loop, with fresh tensors
// every step) does not plan them again.
//
// A plan names the call's buffers by id and offset, never by address, and
// carries no header (algo/step.h): it is a pure function of the call's
// signature (CallPlan: op, buffers' form, count, root, AVG, family; and
// PlanContext::elem, ::slice_elems) and of the communicator (rank, world,
// ring order, topology). So a kept plan is run as it stands on every later
// call of that signature, whatever its buffers: a hit is one lookup.
// Pull plans are kept like the others (their steps name the address table
// by id; the address they publish is resolved when they run). The element
// type is not in the signature: plan_call never sees one (int32 and float32
// share a plan). The in-place forms are (CallPlan::in names a block of the
// output): they never share a plan with the out-of-place ones.
//
// Bounded: at most `capacity` plans and kMaxSteps steps (about 10 MB)
// together; the least recently used go first; a plan longer than the step
// budget is built every time (counted as `uncached`). One thread at a time
// plans (the communicator runs one call at a time); stats() may be read
// from any.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "comm/call_plan.h"
#include "comm/executor.h"

namespace ringcomm {

struct PlanCacheStats {
  uint64_t hits = 0;       // calls whose plan came from the cache
  uint64_t misses = 0;     // calls planned and kept
  uint64_t uncached = 0;   // calls planned that are not kept (over the step budget)
  uint64_t evictions = 0;  // plans dropped to make room
  size_t entries = 0;      // plans held
  size_t steps = 0;        // steps held, all plans together
  size_t capacity = 0;     // 0: the cache is off
};

// One call's plan: its steps and the family its messages carry (MsgTag::algo).
struct Plan {
  ScheduleFamily family = kFamilyFifo;
  Schedule steps;
  FlatShape flat;  // Executor::flat_shape(steps), worked out once when the plan is made
};

class PlanCache {
 public:
  static constexpr size_t kDefaultEntries = 64;
  static constexpr size_t kMaxSteps = size_t{1} << 17;

  // capacity 0 turns the cache off: plan() is plan_call, counting nothing.
  explicit PlanCache(size_t capacity = kDefaultEntries, size_t max_steps = kMaxSteps);

  // The plan of `call` in context `c` (c.out is ignored): the kept one, or
  // one built now. The reference stays valid until the next plan() or clear().
  const Plan& plan(const PlanContext& c, const CallPlan& call);
  // Forget every plan (the ring order or the topology changed).
  void clear();
  PlanCacheStats stats() const;
  // Whether `p` (from plan()) is kept, and until when: a kept plan stays
  // where it is while generation() is unchanged (it moves on eviction and
  // clear()). A caller that remembers the plan of its last call and sees
  // the same call again takes it without a lookup, and counts the hit here.
  bool kept(const Plan& p) const { return &p != &fresh_; }
  uint64_t generation() const { return generation_; }
  // Moves the generation on without dropping a plan: every memo of a plan
  // asks the cache again (the pick for a signature changed: comm/autotune.h).
  void forget_memos() { ++generation_; }
  // Only the thread running the communicator's calls counts (one at a
  // time), so no locked add: stats() may read a count a call behind.
  void count_hit() { hits_.store(hits_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }

 private:
  struct Key {
    CallPlan call;
    size_t elem;
    size_t slice_elems;
    bool operator==(const Key& o) const {
      return call == o.call && elem == o.elem && slice_elems == o.slice_elems;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    Key key;
    Plan plan;
  };
  // The communicator's side of every plan (any change: clear()).
  struct Context {
    int rank = -1, world = 0, ring_pos = 0;
    const int* ring = nullptr;
    const Topology* topo = nullptr;
    const int* members = nullptr;
    bool operator==(const Context& o) const;
  };

  const Plan& build(const PlanContext& c, const Key& key);
  void evict_for(size_t steps);

  const size_t capacity_;
  const size_t max_steps_;
  Context context_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index_;
  Plan fresh_;  // a plan that is not kept (cache off, over the budget)
  size_t held_steps_ = 0;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> hits_{0}, misses_{0}, uncached_{0}, evictions_{0};
  std::atomic<size_t> entries_{0}, steps_{0};
};

}  // namespace ringcomm
