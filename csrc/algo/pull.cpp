// Pull schedules: single copy on one host. Instead of pushing data through
// FIFO slots (copy in, copy out), a rank publishes the address of its buffer
// (a kPublish step: the address is the run's, the plan only names the
// buffer) and its peers read it directly (cross-memory attach). Every message left is
// a few bytes: addresses and "done" signals.
//
// all_reduce (n ranks, blocks as the ring cuts them):
//   1. every rank sends its buffer's address to every peer
//   2. rank r reads block r of each peer and adds it into its own block r
//      (AVG divides after the last peer): block r is final
//   3. signal "block r final" to every peer; on a peer's signal, read its
//      final block p into block p here. A peer overwrites its raw block r
//      only after this rank's signal, which comes after this rank read it.
//   4. signal "done reading" to every peer and wait for theirs: nobody reads
//      this buffer any more once the call returns.
// The other collectives are the same verbs in other arrangements; the side
// whose buffer is read always waits for the readers' "done" before it
// returns, so the caller may reuse its buffer at once.
#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {
namespace {

// Where `buf` lies this run, into this rank's entry of the address table.
void publish(const PlanContext& c, BufRef buf) { push_publish(c, buf, addr_entry(c.rank)); }
// Sends this rank's entry to `to`; a peer's lands in the peer's entry.
void send_address(const PlanContext& c, int to) { push_send(c, to, addr_entry(c.rank), 8); }
size_t recv_address(const PlanContext& c, int from) { return push_recv(c, from, addr_entry(from), 8); }

size_t pull(const PlanContext& c, int peer, BufRef dst, uint64_t remote_offset, size_t n, size_t after) {
  Step s = make_step(StepKind::kPull, c);
  s.recv_peer = peer;
  s.dst = dst;
  s.remote_base = addr_entry(peer);
  s.remote_offset = remote_offset;
  s.nbytes = n;
  s.after = after;
  return push_step(c, s);
}

size_t pull_reduce(const PlanContext& c, int peer, BufRef dst, BufRef src, uint64_t remote_offset,
                   size_t n, size_t after, bool divide) {
  Step s = make_step(StepKind::kPullReduce, c);
  s.recv_peer = peer;
  s.dst = dst;
  s.src = src;
  s.remote_base = addr_entry(peer);
  s.remote_offset = remote_offset;
  s.nbytes = n;
  s.after = after;
  s.divide = divide;
  return push_step(c, s);
}

void fence(const PlanContext& c) { push_step(c, make_step(StepKind::kFence, c)); }

// Everybody tells everybody it is done reading, and waits for the others.
void all_done(const PlanContext& c) {
  fence(c);
  for (int i = 1; i < c.world; ++i) push_send(c, mod(c.rank + i, c.world), nullptr, 0);
  for (int i = 1; i < c.world; ++i) push_recv(c, mod(c.rank - i, c.world), nullptr, 0);
}

// Addresses to and from every peer; returns the index of each peer's receive.
std::vector<size_t> exchange_addresses(const PlanContext& c) {
  std::vector<size_t> got(c.world, SIZE_MAX);
  for (int i = 1; i < c.world; ++i) send_address(c, mod(c.rank + i, c.world));
  for (int i = 1; i < c.world; ++i) {
    int p = mod(c.rank - i, c.world);
    got[p] = recv_address(c, p);
  }
  return got;
}

// Reductions into one buffer must run in a fixed order (AVG divides after the
// last one, and the rounding must not depend on which peer answered first):
// wait for every address, then the pulls run one after the other in list order.
std::vector<size_t> exchange_addresses_then_fence(const PlanContext& c) {
  std::vector<size_t> got = exchange_addresses(c);
  fence(c);
  return got;
}

}  // namespace

void pull_all_reduce(const PlanContext& c, BufRef buf, size_t count, bool avg) {
  const int n = c.world, r = c.rank;
  if (n == 1) return;
  publish(c, buf);
  std::vector<size_t> addr = exchange_addresses_then_fence(c);
  const Range mine = ring_block(count, n, r);
  BufRef own = buf + mine.offset * c.elem;
  for (int i = 1; i < n; ++i) {
    int p = mod(r + i, n);
    pull_reduce(c, p, own, own, mine.offset * c.elem, mine.count * c.elem, addr[p], avg && i == n - 1);
  }
  fence(c);
  for (int i = 1; i < n; ++i) push_send(c, mod(r + i, n), nullptr, 0);  // block r is final
  for (int i = 1; i < n; ++i) {
    int p = mod(r - i, n);
    size_t final_p = push_recv(c, p, nullptr, 0);
    Range b = ring_block(count, n, p);
    pull(c, p, buf + b.offset * c.elem, b.offset * c.elem, b.count * c.elem, final_p);
  }
  all_done(c);
}

void pull_reduce_scatter(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank, bool avg) {
  const int n = c.world, r = c.rank;
  const size_t bytes = count_per_rank * c.elem;
  if (n == 1) {
    push_copy(c, in, out, bytes);
    return;
  }
  publish(c, in);
  std::vector<size_t> addr = exchange_addresses_then_fence(c);
  BufRef acc = in + r * bytes;
  for (int i = 1; i < n; ++i) {
    int p = mod(r + i, n);
    pull_reduce(c, p, out, acc, r * bytes, bytes, addr[p], avg && i == n - 1);
    acc = out;
  }
  all_done(c);
}

void pull_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank) {
  const int n = c.world, r = c.rank;
  const size_t bytes = count_per_rank * c.elem;
  push_copy(c, in, out + r * bytes, bytes);
  if (n == 1) return;
  publish(c, in);
  std::vector<size_t> addr = exchange_addresses(c);
  for (int i = 1; i < n; ++i) {
    int p = mod(r - i, n);
    pull(c, p, out + p * bytes, 0, bytes, addr[p]);
  }
  all_done(c);
}

void pull_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes) {
  const int n = c.world, r = c.rank;
  if (n == 1) return;
  if (r == root) {
    publish(c, buf);
    for (int i = 1; i < n; ++i) send_address(c, mod(r + i, n));
    for (int i = 1; i < n; ++i) push_recv(c, mod(r + i, n), nullptr, 0);
    return;
  }
  size_t a = recv_address(c, root);
  size_t got = pull(c, root, buf, 0, nbytes, a);
  push_send(c, root, nullptr, 0, got);
}

void pull_reduce_to_root(const PlanContext& c, int root, BufRef buf, size_t count, bool avg) {
  const int n = c.world, r = c.rank;
  if (n == 1) return;
  if (r != root) {
    publish(c, buf);
    send_address(c, root);
    push_recv(c, root, nullptr, 0);
    return;
  }
  std::vector<size_t> addr(n, SIZE_MAX);
  for (int i = 1; i < n; ++i) addr[mod(r + i, n)] = recv_address(c, mod(r + i, n));
  fence(c);  // fixed reduction order, as in exchange_addresses_then_fence
  for (int i = 1; i < n; ++i) {
    int p = mod(r + i, n);
    pull_reduce(c, p, buf, buf, 0, count * c.elem, addr[p], avg && i == n - 1);
  }
  fence(c);
  for (int i = 1; i < n; ++i) push_send(c, mod(r + i, n), nullptr, 0);
}

void pull_scatter(const PlanContext& c, int root, BufRef in, BufRef out, size_t nbytes) {
  const int n = c.world, r = c.rank;
  if (r == root) {
    publish(c, in);
    for (int i = 1; i < n; ++i) send_address(c, mod(r + i, n));
    push_copy(c, in + r * nbytes, out, nbytes);
    for (int i = 1; i < n; ++i) push_recv(c, mod(r + i, n), nullptr, 0);
    return;
  }
  size_t a = recv_address(c, root);
  size_t got = pull(c, root, out, r * nbytes, nbytes, a);
  push_send(c, root, nullptr, 0, got);
}

void pull_gather(const PlanContext& c, int root, BufRef in, BufRef out, size_t nbytes) {
  const int n = c.world, r = c.rank;
  if (r != root) {
    publish(c, in);
    send_address(c, root);
    push_recv(c, root, nullptr, 0);
    return;
  }
  push_copy(c, in, out + r * nbytes, nbytes);
  for (int i = 1; i < n; ++i) {
    int p = mod(r - i, n);
    size_t a = recv_address(c, p);
    pull(c, p, out + p * nbytes, 0, nbytes, a);
  }
  fence(c);
  for (int i = 1; i < n; ++i) push_send(c, mod(r + i, n), nullptr, 0);
}

void pull_all_to_all(const PlanContext& c, BufRef in, BufRef out, size_t nbytes) {
  const int n = c.world, r = c.rank;
  push_copy(c, in + r * nbytes, out + r * nbytes, nbytes);
  if (n == 1) return;
  publish(c, in);
  std::vector<size_t> addr = exchange_addresses(c);
  for (int i = 1; i < n; ++i) {
    int p = mod(r - i, n);
    pull(c, p, out + p * nbytes, r * nbytes, nbytes, addr[p]);
  }
  all_done(c);
}

// Point to point: the "done reading" answer cannot travel in the FIFO back to
// the sender (the peer's own sends share it, in an order only the peer's
// program decides), so it goes through a per-pair counter instead.
void pull_send(const PlanContext& c, int peer, BufRef buf) {
  publish(c, buf);
  send_address(c, peer);
  Step s = make_step(StepKind::kAwaitPull, c);
  s.recv_peer = peer;
  push_step(c, s);
}

void pull_recv(const PlanContext& c, int peer, BufRef buf, size_t nbytes) {
  size_t a = recv_address(c, peer);
  size_t got = pull(c, peer, buf, 0, nbytes, a);
  Step s = make_step(StepKind::kAckPull, c);
  s.send_peer = peer;
  s.after = got;
  push_step(c, s);
}

}  // namespace ringcomm
