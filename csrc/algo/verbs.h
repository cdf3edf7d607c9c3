// The verbs schedules are written in, one builder per Step kind (after
// NCCL's primitives: a schedule reads like runRing, one verb per line). Each
// appends one Step to the plan and returns its index (for later steps'
// `after`). Peers are named as the context numbers them: its group index
// when the context is a group of the communicator (PlanContext::members),
// which push_step turns into the communicator's rank.
#pragma once

#include <cstdint>

#include "algo/schedules.h"

namespace ringcomm {

inline Step make_step(StepKind kind, const PlanContext&) {
  Step s{};
  s.kind = kind;
  return s;
}

inline size_t push_step(const PlanContext& c, Step s) {
  if (c.members) {
    if (s.recv_peer >= 0) s.recv_peer = c.members[s.recv_peer];
    if (s.send_peer >= 0) s.send_peer = c.members[s.send_peer];
  }
  c.out->push_back(s);
  return c.out->size() - 1;
}

inline size_t push_send(const PlanContext& c, int peer, BufRef data, size_t nbytes,
                        size_t after = SIZE_MAX) {
  Step s = make_step(StepKind::kSend, c);
  s.send_peer = peer;
  s.src = data;
  s.nbytes = nbytes;
  s.after = after;
  return push_step(c, s);
}

inline size_t push_recv(const PlanContext& c, int peer, BufRef data, size_t nbytes) {
  Step s = make_step(StepKind::kRecv, c);
  s.recv_peer = peer;
  s.dst = data;
  s.nbytes = nbytes;
  return push_step(c, s);
}

// dst <- src (op) what `from` sends.
inline size_t push_recv_reduce(const PlanContext& c, int from, BufRef src, BufRef dst, size_t nbytes,
                               bool divide = false) {
  Step s = make_step(StepKind::kRecvReduce, c);
  s.recv_peer = from;
  s.src = src;
  s.dst = dst;
  s.nbytes = nbytes;
  s.divide = divide;
  return push_step(c, s);
}

// to <- src (op) what `from` sends.
inline size_t push_recv_reduce_send(const PlanContext& c, int from, int to, BufRef src, size_t nbytes) {
  Step s = make_step(StepKind::kRecvReduceSend, c);
  s.recv_peer = from;
  s.send_peer = to;
  s.src = src;
  s.nbytes = nbytes;
  return push_step(c, s);
}

// dst <- src (op) what `from` sends; to <- dst.
inline size_t push_recv_reduce_copy_send(const PlanContext& c, int from, int to, BufRef src, BufRef dst,
                                         size_t nbytes, bool divide) {
  Step s = make_step(StepKind::kRecvReduceCopySend, c);
  s.recv_peer = from;
  s.send_peer = to;
  s.src = src;
  s.dst = dst;
  s.nbytes = nbytes;
  s.divide = divide;
  return push_step(c, s);
}

// dst <- what `from` sends; to <- dst.
inline size_t push_recv_copy_send(const PlanContext& c, int from, int to, BufRef dst, size_t nbytes) {
  Step s = make_step(StepKind::kRecvCopySend, c);
  s.recv_peer = from;
  s.send_peer = to;
  s.dst = dst;
  s.nbytes = nbytes;
  return push_step(c, s);
}

// dst <- a (op) b (a fence).
inline size_t push_reduce(const PlanContext& c, BufRef dst, BufRef a, BufRef b, size_t nbytes,
                          bool divide) {
  Step s = make_step(StepKind::kLocalReduce, c);
  s.dst = dst;
  s.src = a;
  s.src2 = b;
  s.nbytes = nbytes;
  s.divide = divide;
  return push_step(c, s);
}

// The 8 bytes at `entry` (the address table) <- where `buf` lies in this run
// (a fence): what a pull schedule sends its peers.
inline size_t push_publish(const PlanContext& c, BufRef buf, BufRef entry) {
  Step s = make_step(StepKind::kPublish, c);
  s.src = buf;
  s.dst = entry;
  s.nbytes = 8;
  return push_step(c, s);
}

// Later steps start once every earlier one is done.
inline size_t push_fence(const PlanContext& c) { return push_step(c, make_step(StepKind::kFence, c)); }

// A local copy (a fence); nothing when there is nothing to move.
inline void push_copy(const PlanContext& c, BufRef src, BufRef dst, size_t nbytes) {
  if (src == dst || nbytes == 0) return;
  Step s = make_step(StepKind::kLocalCopy, c);
  s.src = src;
  s.dst = dst;
  s.nbytes = nbytes;
  push_step(c, s);
}

}  // namespace ringcomm
