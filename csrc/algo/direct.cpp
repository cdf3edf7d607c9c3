// Direct schedules: every rank talks to its peers without forwarding.
// Sends and receives to different peers use different FIFOs, so the executor
// progresses all of them at once and no ordering of peers can deadlock.
// Peers are visited starting at rank+1 (sends) and rank-1 (receives) so that
// not every rank hits the same peer first.
#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {

void oneshot_all_reduce(const PlanContext& c, BufRef buf, size_t count, BufRef scratch, bool avg) {
  const int n = c.world, r = c.rank;
  if (n == 1) return;
  const size_t bytes = count * c.elem;
  for (int i = 1; i < n; ++i) push_send(c, mod(r + i, n), buf, bytes);
  for (int i = 1; i < n; ++i) {
    int p = mod(r - i, n);
    push_recv(c, p, scratch + p * bytes, bytes);
  }
  // Fold inputs 0..n-1 in rank order. On rank 0 the accumulator is buf itself;
  // elsewhere it is scratch block r (no peer's input lands there) until the
  // last fold writes buf (buf, the own input, is read at fold r before it is
  // overwritten at fold n-1 >= r). The received blocks are only read, so an
  // executor may fold them where they arrived (comm/executor.h FlatShape).
  BufRef acc = r == 0 ? buf : scratch;  // input 0: the received block 0
  for (int p = 1; p < n; ++p) {
    Step s = make_step(StepKind::kLocalReduce, c);
    s.src = acc;
    s.src2 = p == r ? buf : scratch + p * bytes;
    s.dst = (p == n - 1 || r == 0) ? buf : scratch + r * bytes;
    s.nbytes = bytes;
    s.divide = avg && p == n - 1;
    push_step(c, s);
    acc = s.dst;
  }
}

void direct_scatter(const PlanContext& c, int root, BufRef in, BufRef out, size_t nbytes) {
  const int n = c.world, r = c.rank;
  if (r != root) {
    push_recv(c, root, out, nbytes);
    return;
  }
  for (int i = 1; i < n; ++i) {
    int p = mod(r + i, n);
    push_send(c, p, in + p * nbytes, nbytes);
  }
  push_copy(c, in + r * nbytes, out, nbytes);
}

void direct_gather(const PlanContext& c, int root, BufRef in, BufRef out, size_t nbytes) {
  const int n = c.world, r = c.rank;
  if (r != root) {
    push_send(c, root, in, nbytes);
    return;
  }
  for (int i = 1; i < n; ++i) {
    int p = mod(r - i, n);
    push_recv(c, p, out + p * nbytes, nbytes);
  }
  push_copy(c, in, out + r * nbytes, nbytes);
}

void pairwise_all_to_all(const PlanContext& c, BufRef in, BufRef out, size_t nbytes) {
  const int n = c.world, r = c.rank;
  for (int i = 1; i < n; ++i) {
    push_send(c, mod(r + i, n), in + mod(r + i, n) * nbytes, nbytes);
    push_recv(c, mod(r - i, n), out + mod(r - i, n) * nbytes, nbytes);
  }
  push_copy(c, in + r * nbytes, out + r * nbytes, nbytes);
}

// The own block goes to its place first and is sent from there, as the ring
// and Bruck's schedules do (an input that aliases its place in the output
// is then sent as it is).
void direct_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t nbytes) {
  const int n = c.world, r = c.rank;
  push_copy(c, in, out + r * nbytes, nbytes);
  for (int i = 1; i < n; ++i) {
    push_send(c, mod(r + i, n), out + r * nbytes, nbytes);
    push_recv(c, mod(r - i, n), out + mod(r - i, n) * nbytes, nbytes);
  }
}

// The dissemination pattern below with a payload: every round sends this
// rank's pair of words to r + 2^k and folds what r - 2^k sends into the
// other half of `state` (elementwise, by the run's reducer: a minimum), so
// the round's send never reads what its receive writes. A minimum does not
// mind counting a rank twice (non-powers of two), so after ceil(log2 n)
// rounds every rank holds the minimum over all ranks.
BufRef dissemination_agreement(const PlanContext& c, BufRef state) {
  const int n = c.world, r = c.rank;
  constexpr size_t kPair = 2 * sizeof(uint64_t);
  int cur = 0;
  for (int d = 1; d < n; d *= 2) {
    BufRef mine = state + kPair * cur;
    BufRef next = state + kPair * (1 - cur);
    push_send(c, mod(r + d, n), mine, kPair);
    push_recv_reduce(c, mod(r - d, n), mine, next, kPair);
    push_fence(c);
    cur = 1 - cur;
  }
  return state + kPair * cur;
}

// The dissemination barrier (Hensgen, Finkel and Manber 1988): in round k
// every rank sends to r + 2^k and receives from r - 2^k, and starts round
// k+1 only then (a fence), so after ceil(log2 n) rounds each rank has
// heard, through some chain, that every rank arrived. log2 n peers a rank,
// not n-1: a barrier opens no full mesh of connections.
void dissemination_barrier(const PlanContext& c) {
  const int n = c.world, r = c.rank;
  for (int d = 1; d < n; d *= 2) {
    push_send(c, mod(r + d, n), nullptr, 0);
    push_recv(c, mod(r - d, n), nullptr, 0);
    push_fence(c);
  }
}

void p2p_send(const PlanContext& c, int peer, BufRef buf, size_t nbytes) {
  push_send(c, peer, buf, nbytes);
}

void p2p_recv(const PlanContext& c, int peer, BufRef buf, size_t nbytes) {
  push_recv(c, peer, buf, nbytes);
}

}  // namespace ringcomm
