// The one place a collective call is mapped to a schedule, for the CPU
// communicator and the GPU "ring" family alike (the GPU communicator and the
// device simulation the tests drive).
#pragma once

#include <cstddef>

#include "algo/schedules.h"
#include "comm/algo_choice.h"
#include "comm/describe.h"

namespace ringcomm {

struct CallPlan {
  OpKind kind;
  char* out = nullptr;       // the in-place buffer, or the output
  const char* in = nullptr;  // the input of out-of-place calls
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
  // Families that need it (scratch_bytes): memory of the buffers' device.
  char* scratch = nullptr;
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

// Appends the call's steps to c.out (c.elem is the element size) and returns
// the family every message of the call carries (MsgTag::algo). Barrier and
// send/recv are not collectives here (comm/communicator.cpp plans them).
ScheduleFamily plan_call(const PlanContext& c, const CallPlan& call);

}  // namespace ringcomm
