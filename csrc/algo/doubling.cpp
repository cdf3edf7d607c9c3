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
#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {
namespace {

void push_reduce(const PlanContext& c, char* dst, const char* a, const char* b, size_t nbytes, bool divide) {
  Step s = make_step(StepKind::kLocalReduce, c);
  s.dst = dst;
  s.src = a;
  s.src2 = b;
  s.nbytes = nbytes;
  s.divide = divide;
  push_step(c, s);
}

}  // namespace

void recursive_doubling_all_reduce(const PlanContext& c, char* buf, size_t count, char* scratch, bool avg) {
  const int n = c.world, r = c.rank;
  if (n == 1) return;
  const size_t bytes = count * c.elem;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  int v;  // new rank, -1 while sitting out
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      const size_t sent = push_send(c, r + 1, buf, bytes);
      // The result comes back into buf, once the send above is done with it.
      const size_t got = push_recv(c, r + 1, buf, bytes);
      (*c.out)[got].after = sent;
      return;
    }
    push_recv(c, r - 1, scratch, bytes);
    push_reduce(c, buf, buf, scratch, bytes, false);
    v = r / 2;
  } else {
    v = r - rem;
  }
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
