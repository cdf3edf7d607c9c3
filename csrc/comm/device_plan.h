// Which schedule a collective of the GPU "ring" family runs (shared by the GPU
// communicator and the device simulation the tests drive).
#pragma once

#include <cstddef>

#include "algo/schedules.h"
#include "comm/algo_choice.h"
#include "comm/describe.h"

namespace ringcomm {

struct DeviceCall {
  OpKind kind;
  char* out = nullptr;       // the in-place buffer, or the output
  const char* in = nullptr;  // the input of out-of-place calls
  // Elements: the buffer (all_reduce, broadcast, reduce), the output
  // (reduce_scatter, scatter), the input (all_gather, gather, all_to_all).
  size_t count = 0;
  int root = -1;
  bool avg = false;
  // The schedule family: kAuto / kRing run the ring and chain schedules;
  // kRecursiveDoubling (all_reduce) and kTree (broadcast, reduce) need
  // `scratch` of count elements (2 * count for the tree reduce), device memory.
  Algo algo = Algo::kAuto;
  char* scratch = nullptr;
};

// Appends the call's steps to c.out (c.elem is the element size).
void plan_device_call(const PlanContext& c, const DeviceCall& call);

}  // namespace ringcomm
