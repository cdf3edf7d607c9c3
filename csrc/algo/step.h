// The verbs a schedule is written in (after NCCL's primitives): a schedule is
// a list of Steps, each moving one contiguous byte range between this rank and
// at most two peers (receive from one, send to another). Steps touching the
// same FIFO run in list order; steps on different FIFOs run concurrently;
// local steps are fences (they start when all earlier steps are done and
// nothing after them starts before they finish).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/link.h"

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
  // Progress, owned by the executor.
  size_t done = 0;
  uint64_t segment = 0;
  bool complete = false;
};

inline bool is_local(StepKind k) { return k == StepKind::kLocalCopy || k == StepKind::kLocalReduce; }

using Schedule = std::vector<Step>;

}  // namespace ringcomm
