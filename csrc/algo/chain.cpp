// Chain schedules along the ring order (PlanContext::ring: host-contiguous),
// starting at the root's position.
//
// Broadcast: the root sends the whole buffer to root+1, every rank in the
// middle receives a segment, stores it and forwards it at once, the last rank
// (root-1) only receives. The FIFOs pipeline it: with S segments and n ranks
// it takes S + n - 2 segment times, not S * (n - 1).
//
// Reduce to `root`: the chain starts at root+1 and ends at the root: each rank
// adds its own buffer to what it receives and forwards the partial sum; the
// root adds its own and stores the result (AVG divides there). Only the root's
// buffer is written.
#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {
namespace {

int position_of(const PlanContext& c, int rank) {
  for (int p = 0; p < c.world; ++p) {
    if (c.ring[p] == rank) return p;
  }
  return rank;
}

}  // namespace

void chain_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes) {
  const int n = c.world, r = ring_position(c);
  if (n == 1) return;
  const int root_pos = c.ring ? position_of(c, root) : root;
  const int pos = mod(r - root_pos, n);
  Step s{};
  s.nbytes = nbytes;
  if (pos == 0) {
    s.kind = StepKind::kSend;
    s.send_peer = ring_rank(c, r + 1);
    s.src = buf;
  } else if (pos < n - 1) {
    s.kind = StepKind::kRecvCopySend;
    s.recv_peer = ring_rank(c, r - 1);
    s.send_peer = ring_rank(c, r + 1);
    s.dst = buf;
  } else {
    s.kind = StepKind::kRecv;
    s.recv_peer = ring_rank(c, r - 1);
    s.dst = buf;
  }
  push_step(c, s);
}

void chain_reduce(const PlanContext& c, int root, BufRef buf, size_t count, bool avg) {
  const int n = c.world, r = ring_position(c);
  if (n == 1) return;
  const int root_pos = c.ring ? position_of(c, root) : root;
  const int pos = mod(r - root_pos - 1, n);  // the root's successor starts (0), the root ends (n-1)
  Step s{};
  s.nbytes = count * c.elem;
  s.src = buf;
  if (pos == 0) {
    s.kind = StepKind::kSend;
    s.send_peer = ring_rank(c, r + 1);
  } else if (pos < n - 1) {
    s.kind = StepKind::kRecvReduceSend;
    s.recv_peer = ring_rank(c, r - 1);
    s.send_peer = ring_rank(c, r + 1);
  } else {
    s.kind = StepKind::kRecvReduce;
    s.recv_peer = ring_rank(c, r - 1);
    s.dst = buf;
    s.divide = avg;
  }
  push_step(c, s);
}

}  // namespace ringcomm
