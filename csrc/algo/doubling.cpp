// Recursive doubling all-reduce (Thakur, Rabenseifner and Gropp 2005, sec. 4):
// latency-optimal for small and medium messages, log2(p) exchanges of the
// whole buffer instead of the ring's 2(n-1) hops.
//
// With p the largest power of two <= n and rem = n - p, the fix-up for n
// that are not powers of two folds the first 2*rem ranks in pairs: an even
// rank r < 2*rem sends its buffer to r+1 and sits out; the others take new
// ranks (r/2 for the odd ones below 2*rem, r - rem above). At exchange k the
// rank with new rank v swaps its whole buffer with new rank v ^ 2^k (send
// and receive together, into scratch, so large buffers cannot deadlock on
// full FIFOs) and reduces: buf = buf (op) scratch. Every reduction combines
// two partial results over disjoint sets of ranks, and both partners compute
// it (op is commutative bit for bit: SUM, PROD, MIN, MAX and the bitwise ops
// of ringcomm's kernels), so all ranks end with the same bits. Last, each odd
// rank below 2*rem sends the result back to its even partner. AVG divides
// once, at the last exchange.
//
// Rabenseifner's all-reduce (same paper, sec. 4.3) moves 2(p-1)/p of the
// buffer instead of log2(p) whole buffers: a reduce-scatter by recursive
// halving, then an all-gather by recursive doubling, over p blocks
// (ring_block). Before the halving exchange of mask m, new rank v holds the
// partial sums of the 2m blocks starting at v & ~(2m-1); it keeps the half
// that holds block v, sends the other half to v ^ m, receives that rank's
// copy of its own half into scratch and folds it in. After log2(p) exchanges
// v owns block v, fully reduced (AVG divides there, once); each block is
// computed by its owner alone, so every rank ends with the same bits. The
// doubling exchanges then swap owned ranges, m = 1, 2, 4, ..., straight into
// place. The non-power-of-two fix-up is the one above.
#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {
namespace {

// Folds ranks 0..2*rem-1 in pairs (evens send to odds and sit out); returns
// this rank's new rank, or -1 for a rank that sits out (its steps, including
// receiving the result, are pushed).
int fold_in_pairs(const PlanContext& c, BufRef buf, size_t bytes, BufRef scratch, int rem) {
  const int r = c.rank;
  if (r >= 2 * rem) return r - rem;
  if (r % 2 == 0) {
    const size_t sent = push_send(c, r + 1, buf, bytes);
    // The result comes back into buf, once the send above is done with it.
    const size_t got = push_recv(c, r + 1, buf, bytes);
    (*c.out)[got].after = sent;
    return -1;
  }
  push_recv(c, r - 1, scratch, bytes);
  push_reduce(c, buf, buf, scratch, bytes, false);
  return r / 2;
}

}  // namespace

void rabenseifner_all_reduce(const PlanContext& c, BufRef buf, size_t count, BufRef scratch, bool avg) {
  const int n = c.world, r = c.rank;
  if (n == 1) return;
  const size_t elem = c.elem;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  const int v = fold_in_pairs(c, buf, count * elem, scratch, rem);
  if (v < 0) return;
  auto rank_of = [&](int nv) { return nv < rem ? 2 * nv + 1 : nv + rem; };
  // Bytes of blocks [lo, lo + m) of the p blocks.
  auto span = [&](int lo, int m) {
    const Range a = ring_block(count, p, lo), b = ring_block(count, p, lo + m - 1);
    return Range{a.offset * elem, (b.offset + b.count - a.offset) * elem};
  };
  for (int m = p / 2; m >= 1; m /= 2) {
    const int lo = v & ~(2 * m - 1);
    const bool low = (v & m) == 0;
    const Range keep = span(low ? lo : lo + m, m), give = span(low ? lo + m : lo, m);
    const int partner = rank_of(v ^ m);
    push_send(c, partner, buf + give.offset, give.count);
    push_recv(c, partner, scratch, keep.count);
    push_reduce(c, buf + keep.offset, buf + keep.offset, scratch, keep.count, avg && m == 1);
  }
  for (int m = 1; m < p; m *= 2) {
    const int partner_v = v ^ m;
    const Range mine = span(v & ~(m - 1), m), theirs = span(partner_v & ~(m - 1), m);
    const int partner = rank_of(partner_v);
    push_send(c, partner, buf + mine.offset, mine.count);
    push_recv(c, partner, buf + theirs.offset, theirs.count);
    push_fence(c);  // the next exchange sends what this one received
  }
  if (r < 2 * rem) push_send(c, r - 1, buf, count * elem);
}

void recursive_doubling_all_reduce(const PlanContext& c, BufRef buf, size_t count, BufRef scratch, bool avg) {
  const int n = c.world, r = c.rank;
  if (n == 1) return;
  const size_t bytes = count * c.elem;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  const int v = fold_in_pairs(c, buf, bytes, scratch, rem);
  if (v < 0) return;
  auto rank_of = [&](int nv) { return nv < rem ? 2 * nv + 1 : nv + rem; };
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = rank_of(v ^ mask);
    push_send(c, partner, buf, bytes);
    push_recv(c, partner, scratch, bytes);
    push_reduce(c, buf, buf, scratch, bytes, avg && mask * 2 == p);  // a fence: the next send reads buf
  }
  if (r < 2 * rem) push_send(c, r - 1, buf, bytes);
}

}  // namespace ringcomm
