// Small builders shared by the schedules: each appends one Step to the plan
// and returns its index (for later steps' `after`).
#pragma once

#include <cstdint>

#include "algo/schedules.h"

namespace ringcomm {

inline Step make_step(StepKind kind, const PlanContext& c) {
  Step s{};
  s.kind = kind;
  s.tag = c.tag;
  return s;
}

inline size_t push_step(const PlanContext& c, const Step& s) {
  c.out->push_back(s);
  return c.out->size() - 1;
}

inline size_t push_send(const PlanContext& c, int peer, const void* data, size_t nbytes,
                        size_t after = SIZE_MAX) {
  Step s = make_step(StepKind::kSend, c);
  s.send_peer = peer;
  s.src = static_cast<const char*>(data);
  s.nbytes = nbytes;
  s.after = after;
  return push_step(c, s);
}

inline size_t push_recv(const PlanContext& c, int peer, void* data, size_t nbytes) {
  Step s = make_step(StepKind::kRecv, c);
  s.recv_peer = peer;
  s.dst = static_cast<char*>(data);
  s.nbytes = nbytes;
  return push_step(c, s);
}

// A local copy (a fence); nothing when there is nothing to move.
inline void push_copy(const PlanContext& c, const char* src, char* dst, size_t nbytes) {
  if (src == dst || nbytes == 0) return;
  Step s = make_step(StepKind::kLocalCopy, c);
  s.src = src;
  s.dst = dst;
  s.nbytes = nbytes;
  push_step(c, s);
}

}  // namespace ringcomm
