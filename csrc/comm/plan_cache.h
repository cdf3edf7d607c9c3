// The plan cache: the schedules plan_call built, kept per call signature and
// re-based onto each new call's buffers, so that a program repeating its
// calls (a training loop, with fresh tensors every step) does not plan them
// again.
//
// A schedule is a function of the call (op, count, root, family, AVG,
// element size: CallPlan and PlanContext::elem) and of the communicator
// (rank, world, slice, ring order, topology), except for the addresses its
// steps hold: each is the call's output, input or scratch plus an offset, or
// the call's header (MsgTag, whose seq changes every call). So a plan is
// built once more over symbolic buffers, each at the base of an address
// region of its own (plan_cache.cpp), and kept as built; a call of the same signature
// gets a copy re-based: every pointer moved from its region onto the call's
// buffer (the same offset), every header pointer onto the call's header,
// every `after` past the steps already in the schedule. A hit is therefore
// the step-for-step equal of planning afresh, whatever the new addresses.
//
// The one relation between buffers a schedule looks at is equality (a copy
// onto itself is skipped, algo/verbs.h push_copy), which only the in-place
// forms make (the input is this rank's block of the output, or the other
// way round): the signature holds how the input sits in the output when the
// two overlap, and the symbolic input sits the same way. The element type
// is not in it: plan_call never sees one (int32 and float32 share a plan).
//
// A miss runs the plan built from the call's own buffers, as without a
// cache, and keeps the symbolic one only if, re-based onto those buffers, it
// equals that plan step for step. Never kept (planned afresh every time,
// counted as `uncached`): pull schedules, whose steps read the address table
// and whose planning writes this rank's address into it; and, checked when
// the plan is built, never assumed, a plan with a step pointing anywhere but
// the call's buffers and header, one that wrote into the address table, one
// that differs from the fresh plan, and one longer than the step budget.
// The barrier and agree_on_call's rounds do not come here.
//
// Bounded: at most `capacity` plans and kMaxSteps steps (about 10 MB)
// together; the least recently used go first. One thread at a time plans
// (the communicator runs one call at a time); stats() may be read from any.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "comm/call_plan.h"

namespace ringcomm {

struct PlanCacheStats {
  uint64_t hits = 0;       // calls whose plan was re-based from the cache
  uint64_t misses = 0;     // calls planned and kept
  uint64_t uncached = 0;   // calls planned that are not kept (pull, over budget, ...)
  uint64_t evictions = 0;  // plans dropped to make room
  size_t entries = 0;      // signatures held (those never kept included)
  size_t steps = 0;        // steps held, all plans together
  size_t capacity = 0;     // 0: the cache is off
};

class PlanCache {
 public:
  static constexpr size_t kDefaultEntries = 64;
  static constexpr size_t kMaxSteps = size_t{1} << 17;

  // capacity 0 turns the cache off: plan() is plan_call, counting nothing.
  explicit PlanCache(size_t capacity = kDefaultEntries, size_t max_steps = kMaxSteps);

  // As plan_call(c, call): appends the call's steps to c.out and returns the
  // family, from the cache when it holds the call's signature.
  ScheduleFamily plan(const PlanContext& c, const CallPlan& call);
  // Forget every plan (the ring order or the topology changed).
  void clear();
  PlanCacheStats stats() const;

 private:
  struct Key {
    OpKind kind;
    Algo algo;
    bool avg;
    uint8_t buffers;  // kHasOut | kHasIn | kAliased
    int root;
    size_t count;
    size_t elem;
    size_t slice_elems;
    int64_t alias;  // in - out, when they overlap
    bool operator==(const Key& o) const;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    Key key;
    bool kept = false;  // false: this signature is planned afresh every time
    ScheduleFamily family = kFamilyFifo;
    Schedule steps;  // over the symbolic buffers (tag: kSymbolicTag)
  };
  // The communicator's side of every plan (any change: clear()).
  struct Context {
    int rank = -1, world = 0, ring_pos = 0;
    const int* ring = nullptr;
    const Topology* topo = nullptr;
    bool operator==(const Context& o) const;
  };

  // Plans `call` over the symbolic buffers into a new entry (kept or not).
  Entry& build(const PlanContext& c, const CallPlan& call, const Key& key);
  void evict_for(size_t steps);
  void rebase(const Entry& e, const PlanContext& c, const CallPlan& call) const;

  const size_t capacity_;
  const size_t max_steps_;
  Context context_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index_;
  std::vector<uint64_t> addrs_;  // the address table symbolic plans see
  size_t held_steps_ = 0;
  std::atomic<uint64_t> hits_{0}, misses_{0}, uncached_{0}, evictions_{0};
  std::atomic<size_t> entries_{0}, steps_{0};
};

}  // namespace ringcomm
