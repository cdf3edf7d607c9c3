// Binomial trees rooted at `root` (Thakur, Rabenseifner and Gropp 2005, sec.
// 4): broadcast and reduce in ceil(log2 n) hops instead of the chain's n-1,
// for small messages where latency, not bandwidth, is the cost.
//
// Ranks are taken relative to the root: v = (rank - root) mod n. In the
// broadcast, v receives from its parent v - 2^j (2^j the lowest set bit of
// v), then sends to its children v + 2^i for the 2^i below 2^j (largest
// first, so the deepest subtree starts first) that exist. The reduce runs
// the same tree upwards: v receives from each child v + 2^i (smallest first)
// into scratch and folds it into its accumulator, then sends the accumulator
// to its parent; the root's last fold writes its buffer (AVG divides there).
// Only the root's buffer is written. Children's sends wait for the parent's
// receive to complete (`after`), so a rank never forwards what it has not got.
#include <vector>

#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {
namespace {

int lowest_bit_at_least(int v, int n) {
  // The lowest set bit of v (v > 0), or the first power of two >= n for the root.
  if (v == 0) {
    int m = 1;
    while (m < n) m <<= 1;
    return m;
  }
  return v & -v;
}

}  // namespace

void tree_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes) {
  const int n = c.world;
  if (n == 1) return;
  const int v = mod(c.rank - root, n);
  const int top = lowest_bit_at_least(v, n);
  size_t got = SIZE_MAX;
  if (v != 0) got = push_recv(c, mod(v - top + root, n), buf, nbytes);
  for (int m = top >> 1; m >= 1; m >>= 1) {
    if (v + m < n) push_send(c, mod(v + m + root, n), buf, nbytes, got);
  }
}

void tree_reduce(const PlanContext& c, int root, BufRef buf, size_t count, BufRef scratch, bool avg) {
  tree_reduce_from(c, root, buf, buf, count, scratch, avg);
}

void tree_reduce_from(const PlanContext& c, int root, BufRef in, BufRef out, size_t count, BufRef scratch,
                      bool avg) {
  const int n = c.world;
  const size_t bytes = count * c.elem;
  const int v = mod(c.rank - root, n);
  if (n == 1) {
    push_copy(c, in, out, bytes);
    return;
  }
  const int top = lowest_bit_at_least(v, n);
  // scratch: [accumulator | one child's buffer]; the root's last fold goes to out.
  BufRef acc = scratch;
  BufRef child = scratch + bytes;
  std::vector<int> kids;
  for (int m = 1; m < top; m <<= 1) {
    if (v + m < n) kids.push_back(v + m);
  }
  BufRef sum = in;  // what has been folded so far
  for (size_t i = 0; i < kids.size(); ++i) {
    push_recv(c, mod(kids[i] + root, n), child, bytes);
    const bool last = i + 1 == kids.size();
    sum = c.out->at(push_reduce(c, (v == 0 && last) ? out : acc, sum, child, bytes, avg && v == 0 && last)).dst;
  }
  if (v != 0) push_send(c, mod(v - top + root, n), sum, bytes);
}

// The covering forms (schedules.h). Relative ranks v = (rank - root) mod n.
// Broadcast, round d = 2^k: the ranks v < d hold the data; v sends it to
// v + d when that is a rank (v + d < n), and v in [d, 2d) receives it from
// v - d. Reduce, round d: v with lowest set bit d has folded its subtree and
// sends the sum to v - d; v a multiple of 2d receives it from v + d when
// that is a rank, into scratch, and folds it. Every other pair of the round
// (wrapping around mod n) exchanges an empty message. Both sides of a pair
// work out the same size from their relative ranks.
void covering_tree_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes) {
  const int n = c.world;
  const int v = mod(c.rank - root, n);
  for (int d = 1; d < n; d *= 2) {
    const bool sends = v < d && v + d < n;
    const bool gets = v >= d && v < 2 * d;
    push_send(c, mod(v + d + root, n), sends ? buf : BufRef{}, sends ? nbytes : 0);
    push_recv(c, mod(v - d + root, n), gets ? buf : BufRef{}, gets ? nbytes : 0);
    if (2 * d < n) push_fence(c);  // (nothing follows the last round)
  }
}

void covering_tree_reduce(const PlanContext& c, int root, BufRef buf, size_t count, BufRef scratch, bool avg) {
  const int n = c.world;
  const size_t bytes = count * c.elem;
  const int v = mod(c.rank - root, n);
  int last = 1;  // the root's last child: the largest power of two below n
  while (last * 2 < n) last *= 2;
  // scratch: [accumulator | one child's sum]; the root's last fold goes to buf.
  const BufRef acc = scratch, child = scratch + bytes;
  BufRef sum = buf;  // what has been folded so far
  for (int d = 1; d < n; d *= 2) {
    const bool sends = v % (2 * d) == d;
    const bool gets = v % (2 * d) == 0 && v + d < n;
    push_send(c, mod(v - d + root, n), sends ? sum : BufRef{}, sends ? bytes : 0);
    push_recv(c, mod(v + d + root, n), gets ? child : BufRef{}, gets ? bytes : 0);
    if (gets) {
      const bool final = v == 0 && d == last;
      sum = c.out->at(push_reduce(c, final ? buf : acc, sum, child, bytes, avg && final)).dst;
    } else if (2 * d < n) {
      push_fence(c);
    }
  }
}

}  // namespace ringcomm
