// Ring schedules.
//
// The buffer of `count` elements is cut into `world` blocks (ring_block), one
// per rank; block r is the one rank r finishes. A "round" moves a slice of at
// most slice_elems elements of every block; the slice is kept below half the
// FIFO depth, so that the first send of round k+1 can overlap the last receive
// of round k without the ring ever filling all FIFOs (which would deadlock:
// every rank would wait to send, none to receive). Within a round, with
// next = rank + 1 and prev = rank - 1 (mod n), rank r does, as in NCCL:
//
//   reduce-scatter part
//     step 0        send block r-1 to next
//     step j=2..n-1 receive block r-j from prev, add own block r-j, send to next
//     step n        receive block r, add own block r: block r is final
//                   (AVG divides here, once); all-reduce also sends it on
//   all-gather part (all-reduce only)
//     step j=1..n-2 receive final block r-j from prev, store, send to next
//     last          receive final block r+1 from prev, store
//
// Each step moves data one segment (FIFO slot) at a time, so a rank forwards
// the first segment of a step while the previous rank still sends the rest:
// the pipeline runs at segment granularity across the whole ring.
//
// "rank" above is a position in the ring (PlanContext::ring, host-contiguous
// order): next/prev are the ranks at the neighbouring positions. all_reduce
// cuts its buffer by position; reduce_scatter and all_gather map position q
// to the buffer block of the rank at q, so every rank still ends with its own
// block.
#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {

void ring_all_reduce(const PlanContext& c, char* buf, size_t count, bool avg) {
  const int n = c.world, r = ring_position(c), next = ring_rank(c, r + 1), prev = ring_rank(c, r - 1);
  if (n == 1) return;  // the sum (or average) of one input is the input
  const size_t rounds = rounds_for(ring_block(count, n, 0).count, c.slice_elems);
  auto piece = [&](int block, size_t round) {
    return slice_of(ring_block(count, n, mod(block, n)), c.slice_elems, round);
  };
  for (size_t k = 0; k < rounds; ++k) {
    Range p = piece(r - 1, k);
    Step s = make_step(StepKind::kSend, c);
    s.send_peer = next;
    s.src = buf + p.offset * c.elem;
    s.nbytes = p.count * c.elem;
    c.out->push_back(s);
    for (int j = 2; j <= n - 1; ++j) {
      p = piece(r - j, k);
      s = make_step(StepKind::kRecvReduceSend, c);
      s.recv_peer = prev;
      s.send_peer = next;
      s.src = buf + p.offset * c.elem;
      s.nbytes = p.count * c.elem;
      c.out->push_back(s);
    }
    p = piece(r, k);
    s = make_step(StepKind::kRecvReduceCopySend, c);
    s.recv_peer = prev;
    s.send_peer = next;
    s.src = buf + p.offset * c.elem;
    s.dst = buf + p.offset * c.elem;
    s.nbytes = p.count * c.elem;
    s.divide = avg;
    c.out->push_back(s);
    for (int j = 1; j <= n - 2; ++j) {
      p = piece(r - j, k);
      s = make_step(StepKind::kRecvCopySend, c);
      s.recv_peer = prev;
      s.send_peer = next;
      s.dst = buf + p.offset * c.elem;
      s.nbytes = p.count * c.elem;
      c.out->push_back(s);
    }
    p = piece(r + 1, k);
    s = make_step(StepKind::kRecv, c);
    s.recv_peer = prev;
    s.dst = buf + p.offset * c.elem;
    s.nbytes = p.count * c.elem;
    c.out->push_back(s);
  }
}

// The reduce-scatter part alone: the input holds n blocks of count_per_rank
// elements and the final block r goes to `out` (which may alias input block r).
void ring_reduce_scatter(const PlanContext& c, const char* in, char* out, size_t count_per_rank,
                         bool avg) {
  const int n = c.world, r = ring_position(c), next = ring_rank(c, r + 1), prev = ring_rank(c, r - 1);
  const size_t bytes = count_per_rank * c.elem;
  if (n == 1) {
    push_copy(c, in, out, bytes);
    return;
  }
  const size_t rounds = rounds_for(count_per_rank, c.slice_elems);
  const Range whole{0, count_per_rank};
  for (size_t k = 0; k < rounds; ++k) {
    Range p = slice_of(whole, c.slice_elems, k);
    auto block = [&](int b) { return in + ring_rank(c, b) * bytes + p.offset * c.elem; };
    Step s = make_step(StepKind::kSend, c);
    s.send_peer = next;
    s.src = block(r - 1);
    s.nbytes = p.count * c.elem;
    c.out->push_back(s);
    for (int j = 2; j <= n - 1; ++j) {
      s = make_step(StepKind::kRecvReduceSend, c);
      s.recv_peer = prev;
      s.send_peer = next;
      s.src = block(r - j);
      s.nbytes = p.count * c.elem;
      c.out->push_back(s);
    }
    s = make_step(StepKind::kRecvReduce, c);
    s.recv_peer = prev;
    s.src = block(r);
    s.dst = out + p.offset * c.elem;
    s.nbytes = p.count * c.elem;
    s.divide = avg;
    c.out->push_back(s);
  }
}

// The all-gather part alone: own input first goes to output block r (unless
// the input already is that block), then the ring forwards every block.
void ring_all_gather(const PlanContext& c, const char* in, char* out, size_t count_per_rank) {
  const int n = c.world, r = ring_position(c), next = ring_rank(c, r + 1), prev = ring_rank(c, r - 1);
  const size_t bytes = count_per_rank * c.elem;
  push_copy(c, in, out + c.rank * bytes, bytes);
  if (n == 1) return;
  const size_t rounds = rounds_for(count_per_rank, c.slice_elems);
  const Range whole{0, count_per_rank};
  for (size_t k = 0; k < rounds; ++k) {
    Range p = slice_of(whole, c.slice_elems, k);
    auto block = [&](int b) { return out + ring_rank(c, b) * bytes + p.offset * c.elem; };
    Step s = make_step(StepKind::kSend, c);
    s.send_peer = next;
    s.src = in + p.offset * c.elem;
    s.nbytes = p.count * c.elem;
    c.out->push_back(s);
    for (int j = 1; j <= n - 2; ++j) {
      s = make_step(StepKind::kRecvCopySend, c);
      s.recv_peer = prev;
      s.send_peer = next;
      s.dst = block(r - j);
      s.nbytes = p.count * c.elem;
      c.out->push_back(s);
    }
    s = make_step(StepKind::kRecv, c);
    s.recv_peer = prev;
    s.dst = block(r + 1);
    s.nbytes = p.count * c.elem;
    c.out->push_back(s);
  }
}

}  // namespace ringcomm
