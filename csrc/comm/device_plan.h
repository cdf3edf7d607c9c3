// Which schedule a collective of the GPU "ring" family runs (shared by the GPU
// communicator and the device simulation the tests drive).
#pragma once

#include <cstddef>

#include "algo/schedules.h"
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
};

// Appends the call's steps to c.out (c.elem is the element size).
void plan_device_call(const PlanContext& c, const DeviceCall& call);

}  // namespace ringcomm
