// The one place a collective call is mapped to a schedule, for the CPU
// communicator and the GPU "ring" family alike (the GPU communicator and the
// device simulation the tests drive).
#pragma once

#include <cstddef>

#include "algo/schedules.h"
#include "comm/algo_choice.h"
#include "comm/describe.h"

namespace ringcomm {

// A call as the planner sees it: no addresses, only which buffers the call
// has and how they sit (algo/step.h BufRef), so that the plan is the same
// for every call of this signature and can be kept (comm/plan_cache.h).
struct CallPlan {
  OpKind kind;
  // The in-place buffer or the output: kOut at 0, or kNone on a rank that
  // has none (a gather's non-root); the input: kIn at 0, or kNone (in-place
  // ops, a scatter's non-root). The in-place forms of the out-of-place ops
  // (the input is this rank's block of the output, or the other way round)
  // name the smaller buffer as a block of the larger one (call_buffers), so
  // that the schedule sees the two are one (push_copy skips a copy onto itself).
  BufRef out;
  BufRef in;
  // Elements: the buffer (all_reduce, broadcast, reduce), the output
  // (reduce_scatter, scatter), the input (all_gather, gather, all_to_all).
  size_t count = 0;
  int root = -1;
  bool avg = false;
  // The schedule family, already resolved; kAuto, like default_algo()'s
  // kRing / kDirect, runs the op's default family (ring for all_reduce,
  // reduce_scatter and all_gather, the chain for broadcast and reduce,
  // direct exchanges for the rest). kPull needs
  // PlanContext::addrs (CPU only), kHierarchical PlanContext::topo.
  Algo algo = Algo::kAuto;
  // Families that need it (scratch_bytes): memory of the buffers' device,
  // given per run as PlanBuffers::base[kScratch].
  BufRef scratch{kScratch, 0};

  // The whole signature (what the plan depends on besides the communicator).
  bool operator==(const CallPlan& o) const {
    return kind == o.kind && out == o.out && in == o.in && count == o.count && root == o.root && avg == o.avg &&
           algo == o.algo && scratch == o.scratch;
  }
};

// CallPlan::out and ::in for a call whose output (null: none) and input
// (null: none) are these: kOut and kIn, or, when they overlap (the in-place
// forms: one is a block of the other), both named in the larger one.
inline void call_buffers(const char* out, size_t out_bytes, const char* in, size_t in_bytes, CallPlan* call) {
  call->out = out ? BufRef{kOut, 0} : BufRef{};
  call->in = in ? BufRef{kIn, 0} : BufRef{};
  if (!out || !in || !out_bytes || !in_bytes) return;
  if (!(out < in + in_bytes && in < out + out_bytes)) return;
  if (in >= out) {
    call->in = {kOut, static_cast<uint64_t>(in - out)};
  } else {
    call->out = {kIn, static_cast<uint64_t>(out - in)};
  }
}

// A call with its buffers' addresses, as the GPU paths and the test hooks
// issue it: what it plans as (plan_of) and the buffers it runs on (buffers_of).
struct AddressedCall {
  OpKind kind;
  char* out = nullptr;       // the in-place buffer, or the output
  const char* in = nullptr;  // the input of out-of-place calls
  size_t count = 0;          // as CallPlan::count
  int root = -1;
  bool avg = false;
  Algo algo = Algo::kAuto;
  char* scratch = nullptr;   // as CallPlan::scratch
};

// Elements of each block a ring round moves (PlanContext::slice_elems) over
// FIFOs of `nslots` slots of `slot_bytes`: a quarter of the FIFO depth, well
// below the half that keeps the ring deadlock free (see algo/ring.cpp).
inline size_t ring_slice_elems(size_t slot_bytes, int nslots, size_t elem) {
  const size_t segments = nslots / 4 > 1 ? static_cast<size_t>(nslots / 4) : 1;
  const size_t slice = segments * slot_bytes / elem;
  return slice > 1 ? slice : 1;
}

// Bytes of scratch `call`'s family needs (0 for most).
size_t scratch_bytes(const CallPlan& call, size_t elem, int world);

// Bytes of the input and the output a collective of `kind` moving `count`
// elements (as CallPlan::count counts them) has on every rank, as the
// communicator validates them (the input is 0 for in-place ops).
void call_buffer_bytes(OpKind kind, size_t count, size_t elem, int world, size_t* in, size_t* out);

// The CallPlan of `a` (elem: bytes per element) and the buffers it runs on
// (kAddrs, kState: none).
CallPlan plan_of(const AddressedCall& a, size_t elem, int world);
PlanBuffers buffers_of(const AddressedCall& a);

// Appends the call's steps to c.out (c.elem is the element size) and returns
// the family every message of the call carries (MsgTag::algo). The barrier
// is planned here too (the dissemination barrier, family kFamilyFifo);
// send/recv are not (comm/p2p_match.cpp runs them).
ScheduleFamily plan_call(const PlanContext& c, const CallPlan& call);
// Whether plan_call makes a two-rank rooted plan of `family` mutual: every
// family but pull, whose steps carry no headers to check.
inline bool family_can_be_mutual(ScheduleFamily family) { return family != kFamilyPull; }
// PlanContext::mutual_pair of a communicator: two ranks, the agreement check on.
inline bool wants_mutual_pair(int world, bool check_agreement) { return world == 2 && check_agreement; }
// PlanContext::covering of a communicator: more than two ranks, the check on.
inline bool wants_covering(int world, bool check_agreement) { return world > 2 && check_agreement; }
// Whether a rooted call's plan, made by a communicator of `world` ranks with
// the agreement check as given (the two flags above), has every rank hear
// from every other through messages whose headers are checked, so that it
// needs no agreement round: at two ranks every family but pull (whose steps
// carry no headers), made mutual; beyond, the tree family's broadcast and
// reduce, in their covering form. The one place that says which plans
// check themselves (Communicator::run_call, the cost model, the plan checker).
inline bool plan_checks_itself(int world, bool check_agreement, OpKind kind, ScheduleFamily family) {
  if (wants_mutual_pair(world, check_agreement)) return family_can_be_mutual(family);
  return wants_covering(world, check_agreement) && family == kFamilyTree &&
         (kind == OpKind::kBroadcast || kind == OpKind::kReduce);
}

}  // namespace ringcomm
