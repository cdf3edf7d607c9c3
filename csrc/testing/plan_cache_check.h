// The plan cache's checker: one rank's PlanCache (comm/plan_cache.h) planning
// calls over fake buffers at addresses the caller picks (never read or
// written), every plan it hands out compared step by step with the plan
// plan_call builds afresh from the same call. The tests drive it over every
// op, family, world size, rank, count and root, moving the buffers between
// calls as a training loop's fresh tensors move, and read which calls hit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/plan_cache.h"

namespace ringcomm {

struct CacheCheckCall {
  OpKind kind = OpKind::kAllReduce;  // a collective (not the barrier)
  Algo algo = Algo::kAuto;           // as CallPlan::algo
  size_t count = 0;                  // elements, as CallPlan::count
  size_t elem = 4;
  int root = -1;
  bool avg = false;
  // Fake addresses of the buffers (0: absent, as a rooted call's other
  // side). in_place: the one overlap the communicator allows, made from
  // these: reduce_scatter and scatter's output is this rank's block of the
  // input, all_gather and gather's input this rank's block of the output.
  uintptr_t out = 0, in = 0, scratch = 0;
  bool in_place = false;
  size_t prefix = 0;  // steps already in the schedule the call is appended to
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
  // `tamper` changes the cache's plan first (how the tests prove a
  // difference is reported). ValueError for a call that is not valid.
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
  std::vector<uint64_t> addrs_;
  MsgTag tags_[2];  // calls alternate between two headers, so a kept header pointer shows
  uint64_t calls_ = 0;
};

}  // namespace ringcomm
