// The plan checker: builds every rank's schedule of one call (plan_call, a
// PlanContext per rank, over fake buffers that are never read or written)
// and proves, without any process or transport, that the ranks' schedules
// fit together:
//
//   - every step is well formed: peers in range and not itself, `after`
//     naming an earlier step, every byte range it reads or writes inside
//     this rank's buffers (and nothing written into the input);
//   - every message a rank sends to a peer is matched by a receive of the
//     same size on that peer, in the same order, and nothing is left over;
//   - run together, the schedules complete: all ranks are simulated in one
//     thread under the executor's own ordering rules (comm/step_order.h,
//     the code the executor runs), each FIFO holding at most `nslots`
//     segments of `slot_bytes`, pull steps reading only addresses that have
//     arrived, from peers that have not yet returned (pulls run last, only
//     when nothing else can move: the order in which an owner is likeliest
//     to have returned before its readers read); or, for the device
//     executor, its grouped transfers under the strict group semantics of
//     testing/device_sim.h;
//   - a rooted call with the agreement check (CPU executor): every rank has
//     heard from every other, through a chain of messages (each header
//     checked against its receiver's call), before it finishes, whether by
//     the agreement's rounds or by the plan's own messages where it checks
//     itself (comm/call_plan.h plan_checks_itself): ranks that disagree on
//     the call cannot return.
//
// Data is not followed (only the addresses pull schedules send): a plan that
// moves the right sizes to the right peers but the wrong blocks passes.
//
// One interleaving suffices: a step that may move stays movable until it
// moves (a FIFO only fills by its one sender and only drains by its one
// receiver, and a rank's own rules depend on its own progress alone), so if
// any order of the ranks deadlocks, every order does.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "comm/algo_choice.h"
#include "comm/call_plan.h"

namespace ringcomm {

struct PlanCheckCall {
  OpKind kind = OpKind::kAllReduce;  // a collective, or kBarrier
  Algo algo = Algo::kAuto;           // as CallPlan::algo (kAuto: the op's default family)
  int world = 1;
  size_t count = 0;  // elements, as CallPlan::count
  size_t elem = 4;   // bytes per element
  int root = -1;
  bool avg = false;
  std::vector<int> ring;   // the ring's order (position -> rank); empty: rank order
  std::vector<int> hosts;  // each rank's host label (hierarchical schedules); empty: one host
  // Rooted calls: planned as a communicator with the agreement check plans
  // them (CPU executor), with Communicator::agree_on_call's rounds first
  // unless the plan checks itself.
  bool agreement = false;
  size_t slot_bytes = 128 * 1024;
  int nslots = 16;
  size_t slice_elems = 0;  // 0: as the communicator picks (ring_slice_elems)
  bool device = false;     // run the device executor's groups instead of the CPU executor's steps
  size_t chunk_bytes = 128 * 1024;  // device: the most one transfer moves
};

struct PlanCheckResult {
  std::string error;  // empty when the plan is sound
  ScheduleFamily family = kFamilyFifo;
  size_t steps = 0;     // over all ranks
  size_t messages = 0;  // segments (device: transfers) sent over all ranks
  size_t passes = 0;    // sweeps over the ranks until all completed
};

// Called with each rank's schedule once planned, before it is checked: how
// the tests break a plan on purpose.
using PlanTamper = std::function<void(int rank, Schedule& steps)>;

// Throws ValueError for a call that is not valid (world, root, ring order,
// counts); reports a plan that is wrong in PlanCheckResult::error, naming the
// rank, the step index and what is wrong.
PlanCheckResult check_plan(const PlanCheckCall& call, const PlanTamper& tamper = {});

}  // namespace ringcomm
