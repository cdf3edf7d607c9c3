// The verbs a schedule is written in (after NCCL's primitives): a schedule is
// a list of Steps, each moving one contiguous byte range between this rank and
// at most two peers (receive from one, send to another). Steps touching the
// same FIFO run in list order; steps on different FIFOs run concurrently;
// local steps are fences (they start when all earlier steps are done and
// nothing after them starts before they finish).
//
// Steps name memory relative to the call's buffers (a BufRef: which buffer,
// and the offset into it), never by address, and carry no message header:
// the executor is given the buffers (PlanBuffers) and the header (MsgTag)
// of each run. A plan is therefore a pure function of the call's signature
// (op, count, root, family, AVG, element size) and of the communicator
// (rank, world, slice, ring order, topology): it is kept (comm/plan_cache.h)
// and run again as it stands, on the next call's buffers.
//
// Pull steps read a peer's buffer directly (single copy, where the transport
// can: cross-memory attach on one host). A rank publishes where its buffer
// lies (kPublish: the address of a BufRef, resolved at run time, into its
// entry of the address table, buffer kAddrs) and sends that entry to the
// peer as an 8-byte message, which lands in the peer's table; a pull reads
// from the address at `remote_base` (an entry of the table) plus
// remote_offset and names that receive as the step it comes `after`. Pulls
// are not fences, so pulls of independent send/recv calls never wait for
// each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringcomm/msg_tag.h"

namespace ringcomm {

// The buffers a step can name. kOut: the in-place buffer or the output;
// kIn: the input of out-of-place calls (an in-place call's input is a block
// of kOut, named as such); kScratch: the family's scratch; kState: the
// agreement's words (Communicator::agree_on_call); kAddrs: the pull address
// table (world entries of 8 bytes). kNone: no buffer (a rooted call's absent
// side, an empty message); it resolves to null plus the offset, as the
// pointer arithmetic on a null buffer did, and is never read or written.
enum BufId : uint8_t { kNone = 0, kOut = 1, kIn = 2, kScratch = 3, kState = 4, kAddrs = 5, kNumBufs = 6 };

// A place in one of the call's buffers. Schedules compute with it as with
// a pointer (base + offset); the only relation between places they look at
// is equality (a copy onto itself is skipped, algo/verbs.h push_copy).
struct BufRef {
  uint8_t buf = kNone;
  uint64_t offset = 0;

  constexpr BufRef() = default;
  constexpr BufRef(uint8_t b, uint64_t off) : buf(b), offset(off) {}
  constexpr BufRef(std::nullptr_t) {}  // no buffer (an empty message's)
  BufRef operator+(uint64_t n) const { return {buf, offset + n}; }
  BufRef& operator+=(uint64_t n) {
    offset += n;
    return *this;
  }
  bool operator==(const BufRef& o) const { return buf == o.buf && offset == o.offset; }
  bool operator!=(const BufRef& o) const { return !(*this == o); }
};

// Where each buffer of one run lies (null: the call has no such buffer).
struct PlanBuffers {
  char* base[kNumBufs] = {};
  char* at(BufRef r) const { return base[r.buf] + r.offset; }
};

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
  kAckPull,             // tell send_peer its message (the run's header's seq) was read
  kAwaitPull,           // wait until recv_peer has read this rank's message (the header's seq)
  kPublish,             // the 8 bytes at dst <- the address src resolves to (a fence)
};

struct Step {
  StepKind kind;
  bool divide = false;  // AVG: divide the reduced result by the world size
  int recv_peer = -1;
  int send_peer = -1;
  BufRef dst;
  BufRef src;
  BufRef src2;
  size_t nbytes = 0;
  // Pull steps: the peer (recv_peer), the address table entry its address
  // arrives in (kAddrs) and the offset from that address.
  BufRef remote_base;
  uint64_t remote_offset = 0;
  // Any step: the index of a step that must be complete before this one starts.
  size_t after = SIZE_MAX;
};

// Field by field (a Step's padding is not part of it): how the tests check
// a kept plan against a fresh one (the test hook testing/plan_cache_check.cpp).
inline bool operator==(const Step& a, const Step& b) {
  return a.kind == b.kind && a.divide == b.divide && a.recv_peer == b.recv_peer && a.send_peer == b.send_peer &&
         a.dst == b.dst && a.src == b.src && a.src2 == b.src2 && a.nbytes == b.nbytes &&
         a.remote_base == b.remote_base && a.remote_offset == b.remote_offset && a.after == b.after;
}
inline bool operator!=(const Step& a, const Step& b) { return !(a == b); }

inline bool is_local(StepKind k) {
  return k == StepKind::kLocalCopy || k == StepKind::kLocalReduce || k == StepKind::kFence ||
         k == StepKind::kPublish;
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
