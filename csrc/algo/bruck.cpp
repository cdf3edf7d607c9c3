// Bruck's all-gather (Bruck et al. 1997; Thakur, Rabenseifner and Gropp 2005,
// sec. 4.1): ceil(log2 n) steps for any n, against the ring's n-1, for small
// and medium blocks.
//
// Think of rank r's blocks in the order r, r+1, ..., r+n-1 (mod n); after
// step k (distance d = 2^k) it holds the first min(2d, n) of them. At step k
// it sends the first cnt = min(d, n - d) it holds to rank r - d and receives
// the next cnt from rank r + d (they are that rank's first cnt). Block i of
// that order is output block (r + i) mod n, so every block is received
// straight into its place in `out`; a range that runs past the last block
// wraps to block 0 and is sent as two pieces (the receiver cuts it at the
// same block, so the pieces match). A fence ends each step: the next one
// sends what this one received.
#include <algorithm>

#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {

void bruck_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank) {
  const int n = c.world, r = c.rank;
  const size_t bytes = count_per_rank * c.elem;
  push_copy(c, in, out + r * bytes, bytes);
  if (n == 1) return;
  // Calls `f(first_block, blocks)` for the pieces of blocks [b, b + cnt) mod n.
  auto pieces = [&](int b, int cnt, auto&& f) {
    b = mod(b, n);
    const int first = std::min(cnt, n - b);
    f(b, first);
    if (cnt > first) f(0, cnt - first);
  };
  for (int d = 1; d < n; d *= 2) {
    const int cnt = std::min(d, n - d);
    pieces(r, cnt, [&](int b, int k) { push_send(c, mod(r - d, n), out + b * bytes, k * bytes); });
    pieces(r + d, cnt, [&](int b, int k) { push_recv(c, mod(r + d, n), out + b * bytes, k * bytes); });
    push_fence(c);
  }
}

}  // namespace ringcomm
