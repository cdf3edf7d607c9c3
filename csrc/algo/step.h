// The verbs a schedule is written in (after NCCL's primitives): a schedule is
// a list of Steps, each moving one contiguous byte range between this rank and
// at most two peers (receive from one, send to another). Steps touching the
// same FIFO run in list order; steps on different FIFOs run concurrently;
// local steps are fences (they start when all earlier steps are done and
// nothing after them starts before they finish).
//
// Pull steps read a peer's buffer directly (single copy, where the transport
// can: cross-memory attach on one host). The peer first sends the address of
// its buffer as an 8-byte message into *remote_base; a pull names that
// receive as the step it comes `after`. Pulls are not fences, so pulls of
// independent send/recv calls never wait for each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringcomm/msg_tag.h"

namespace ringcomm {

enum class StepKind : uint8_t {
  kSend,                // send_peer <- src
  kRecv,                // dst <- recv_peer
  kRecvReduce,          // dst <- src (op) recv_peer
  kRecvReduceSend,      // send_peer <- src (op) recv_peer
  kRecvReduceCopySend,  // dst <- src (op) recv_peer; send_peer <- dst
  kRecvCopySend,        // dst <- recv_peer; send_peer <- dst
  kLocalCopy,           // dst <- src
  kLocalReduce,         // dst <- src (op) src2
  kFence,               // nothing; later steps wait until all earlier ones are done
  kPull,                // dst <- peer's memory at *remote_base + remote_offset
  kPullReduce,          // dst <- src (op) peer's memory at *remote_base + remote_offset
  kAckPull,             // tell send_peer its message tag->seq was read
  kAwaitPull,           // wait until recv_peer has read this rank's message tag->seq
};

struct Step {
  StepKind kind;
  bool divide = false;  // AVG: divide the reduced result by the world size
  int recv_peer = -1;
  int send_peer = -1;
  char* dst = nullptr;
  const char* src = nullptr;
  const char* src2 = nullptr;
  size_t nbytes = 0;
  const MsgTag* tag = nullptr;
  // Pull steps: the peer (recv_peer), where its address arrives and the
  // offset from that address.
  const uint64_t* remote_base = nullptr;
  uint64_t remote_offset = 0;
  // Any step: the index of a step that must be complete before this one starts.
  size_t after = SIZE_MAX;
};

// Field by field (a Step's padding is not part of it): how a kept plan is
// checked against a fresh one (comm/plan_cache.cpp).
inline bool operator==(const Step& a, const Step& b) {
  return a.kind == b.kind && a.divide == b.divide && a.recv_peer == b.recv_peer && a.send_peer == b.send_peer &&
         a.dst == b.dst && a.src == b.src && a.src2 == b.src2 && a.nbytes == b.nbytes && a.tag == b.tag &&
         a.remote_base == b.remote_base && a.remote_offset == b.remote_offset && a.after == b.after;
}
inline bool operator!=(const Step& a, const Step& b) { return !(a == b); }

inline bool is_local(StepKind k) {
  return k == StepKind::kLocalCopy || k == StepKind::kLocalReduce || k == StepKind::kFence;
}
// Steps that use no FIFO (they read memory or counters directly).
inline bool is_pull(StepKind k) {
  return k == StepKind::kPull || k == StepKind::kPullReduce || k == StepKind::kAckPull ||
         k == StepKind::kAwaitPull;
}

// Steps that take messages from recv_peer's FIFO, and that put messages into
// send_peer's.
inline bool uses_recv(StepKind k) {
  return k == StepKind::kRecv || k == StepKind::kRecvReduce || k == StepKind::kRecvReduceSend ||
         k == StepKind::kRecvReduceCopySend || k == StepKind::kRecvCopySend;
}
inline bool uses_send(StepKind k) {
  return k == StepKind::kSend || k == StepKind::kRecvReduceSend || k == StepKind::kRecvReduceCopySend ||
         k == StepKind::kRecvCopySend;
}

using Schedule = std::vector<Step>;

}  // namespace ringcomm
