// The plan cache's checker: one rank's PlanCache (comm/plan_cache.h) planning
// calls, every plan it hands out compared step by step with the plan
// plan_call builds afresh from the same call. Plans name buffers by id and
// offset (algo/step.h), so no buffer is involved: the tests drive it over
// every op, family, world size, rank, count, root and buffer form (present
// or absent, in place or not) and read which calls hit; that a kept plan
// computes the right answers on fresh buffers the spawned-rank tests check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/plan_cache.h"

namespace ringcomm {

struct CacheCheckCall {
  OpKind kind = OpKind::kAllReduce;  // a collective or the barrier
  Algo algo = Algo::kAuto;           // as CallPlan::algo
  size_t count = 0;                  // elements, as CallPlan::count
  size_t elem = 4;
  int root = -1;
  bool avg = false;
  // Which buffers the call has (a rooted call's other side may be absent),
  // and in_place: the one overlap the communicator allows: reduce_scatter
  // and scatter's output is this rank's block of the input, all_gather and
  // gather's input this rank's block of the output.
  bool has_out = true, has_in = true;
  bool in_place = false;
};

struct CacheCheckResult {
  std::string mismatch;  // empty when the cached plan is the fresh one
  bool hit = false;      // the plan came from the cache
  bool kept = false;     // the cache holds it now (a hit, or a miss it kept)
  ScheduleFamily family = kFamilyFifo;
  size_t steps = 0;
};

class PlanCacheChecker {
 public:
  // ring: the ring's order (empty: rank order); hosts: each rank's host
  // label (empty: one host); slice_elems as PlanContext's.
  PlanCacheChecker(int rank, int world, size_t capacity, size_t max_steps, std::vector<int> ring,
                   std::vector<int> hosts, size_t slice_elems);
  // Plans `call` through the cache and afresh and compares the two;
  // `tamper` changes a copy of the cache's plan first (how the tests prove
  // a difference is reported). ValueError for a call that is not valid.
  CacheCheckResult plan(const CacheCheckCall& call, const std::function<void(Schedule&)>& tamper = {});
  PlanCacheStats stats() const { return cache_.stats(); }
  void clear() { cache_.clear(); }

 private:
  const int rank_, world_;
  const size_t slice_elems_;
  std::vector<int> ring_;
  int ring_pos_ = 0;
  Topology topo_;
  PlanCache cache_;
};

}  // namespace ringcomm
