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
#include <tuple>
#include <utility>

#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {

// The in-place ring over any block layout: `block(q)` is the element range
// position q finishes (ring_all_reduce: ring_block; the hierarchical
// schedules: a few blocks and empty ones). `rs` runs the reduce-scatter
// part, `ag` the all-gather part; both fused is the all-reduce above.
template <class Block>
void ring_in_place(const PlanContext& c, BufRef buf, Block block, size_t max_block, bool rs, bool ag, bool avg) {
  const int n = c.world, r = ring_position(c), next = ring_rank(c, r + 1), prev = ring_rank(c, r - 1);
  if (n == 1) return;
  const size_t rounds = rounds_for(max_block, c.slice_elems);
  for (size_t k = 0; k < rounds; ++k) {
    auto at = [&](int pos) {
      const Range p = slice_of(block(mod(pos, n)), c.slice_elems, k);
      return std::make_pair(buf + p.offset * c.elem, p.count * c.elem);
    };
    if (rs) {
      auto [src, len] = at(r - 1);
      push_send(c, next, src, len);
      for (int j = 2; j <= n - 1; ++j) {
        std::tie(src, len) = at(r - j);
        push_recv_reduce_send(c, prev, next, src, len);
      }
      std::tie(src, len) = at(r);
      if (ag) {
        push_recv_reduce_copy_send(c, prev, next, src, src, len, avg);
      } else {
        push_recv_reduce(c, prev, src, src, len, avg);
      }
    } else {
      auto [src, len] = at(r);
      push_send(c, next, src, len);
    }
    if (ag) {
      for (int j = 1; j <= n - 2; ++j) {
        auto [dst, len] = at(r - j);
        push_recv_copy_send(c, prev, next, dst, len);
      }
      auto [dst, len] = at(r + 1);
      push_recv(c, prev, dst, len);
    }
  }
}

void ring_all_reduce(const PlanContext& c, BufRef buf, size_t count, bool avg) {
  const int n = c.world;
  ring_in_place(c, buf, [&](int q) { return ring_block(count, n, q); }, ring_block(count, n, 0).count, true, true, avg);
}

void ring_reduce_scatter_blocks(const PlanContext& c, BufRef buf, const Range* blocks, size_t max_block, bool avg) {
  ring_in_place(c, buf, [&](int q) { return blocks[q]; }, max_block, true, false, avg);
}

void ring_all_gather_blocks(const PlanContext& c, BufRef buf, const Range* blocks, size_t max_block) {
  ring_in_place(c, buf, [&](int q) { return blocks[q]; }, max_block, false, true, false);
}

// The reduce-scatter part alone: the input holds n blocks of count_per_rank
// elements and the final block r goes to `out` (which may alias input block r).
void ring_reduce_scatter(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank,
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
    const Range p = slice_of(whole, c.slice_elems, k);
    const size_t len = p.count * c.elem;
    auto block = [&](int b) { return in + ring_rank(c, b) * bytes + p.offset * c.elem; };
    push_send(c, next, block(r - 1), len);
    for (int j = 2; j <= n - 1; ++j) push_recv_reduce_send(c, prev, next, block(r - j), len);
    push_recv_reduce(c, prev, block(r), out + p.offset * c.elem, len, avg);
  }
}

// The all-gather part alone: own input first goes to output block r (unless
// the input already is that block), then the ring forwards every block.
void ring_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank) {
  const int n = c.world, r = ring_position(c), next = ring_rank(c, r + 1), prev = ring_rank(c, r - 1);
  const size_t bytes = count_per_rank * c.elem;
  push_copy(c, in, out + c.rank * bytes, bytes);
  if (n == 1) return;
  const size_t rounds = rounds_for(count_per_rank, c.slice_elems);
  const Range whole{0, count_per_rank};
  for (size_t k = 0; k < rounds; ++k) {
    const Range p = slice_of(whole, c.slice_elems, k);
    const size_t len = p.count * c.elem;
    auto block = [&](int b) { return out + ring_rank(c, b) * bytes + p.offset * c.elem; };
    push_send(c, next, in + p.offset * c.elem, len);
    for (int j = 1; j <= n - 2; ++j) push_recv_copy_send(c, prev, next, block(r - j), len);
    push_recv(c, prev, block(r + 1), len);
  }
}

}  // namespace ringcomm
