// Hierarchical all-reduce for communicators that span hosts (as Horovod's
// and NCCL's tree-of-rings idea, written over the same verbs):
//
//   1. intra-host ring reduce-scatter: with lmin the fewest ranks any host
//      has, the buffer is cut into lmin blocks; local index q < lmin ends
//      with block q summed over its host, ranks beyond lmin own an empty
//      block (they still feed their data into the ring);
//   2. inter-host ring all-reduce of block q among the ranks of local index
//      q, one per host: lmin rings at once, each moving 1/lmin of the data,
//      so every host's link carries the buffer once per direction in total
//      (the flat ring's share, but in H-1 inter-host hops, not n-1);
//   3. intra-host ring all-gather of the lmin final blocks.
//
// Fences separate the phases (each phase reads what the last one wrote).
// Every block is reduced across hosts by one ring only, and distributed by
// copies: all ranks end with the same bits. AVG divides once, in phase 2
// (the executor divides by the communicator's size).
#include <vector>

#include "algo/blocks.h"
#include "algo/schedules.h"
#include "algo/verbs.h"

namespace ringcomm {

namespace {

// No hierarchy to use: one host (or no topology for this context).
bool one_host(const PlanContext& c) { return c.topo == nullptr || c.topo->hosts == 1 || c.topo->world() != c.world; }

// The context of a group of the communicator's ranks (`members`, this rank
// at `index`): peers by group index, rings in group order.
PlanContext group_of(const PlanContext& c, const std::vector<int>& members, int index) {
  PlanContext g = c;
  g.rank = index;
  g.world = static_cast<int>(members.size());
  g.members = members.data();
  g.ring = nullptr;
  g.ring_pos = 0;
  g.topo = nullptr;
  return g;
}

// This rank's host group, by local index.
PlanContext host_group(const PlanContext& c) {
  const Topology& t = *c.topo;
  return group_of(c, t.members[t.host_of[c.rank]], t.local_index[c.rank]);
}

// The ranks of local index q, one per host, in host order.
std::vector<int> column(const Topology& t, int q) {
  std::vector<int> ranks(t.hosts);
  for (int g = 0; g < t.hosts; ++g) ranks[g] = t.members[g][q];
  return ranks;
}

// The leaders of the trees of trees: the root on its host, the lowest rank
// elsewhere (one per host, in host order).
std::vector<int> leaders_of(const Topology& t, int root) {
  std::vector<int> ranks = column(t, 0);
  ranks[t.host_of[root]] = root;
  return ranks;
}

}  // namespace

void hierarchical_all_reduce(const PlanContext& c, BufRef buf, size_t count, bool avg) {
  if (one_host(c)) {
    ring_all_reduce(c, buf, count, avg);  // one host: the hierarchy is the ring
    return;
  }
  const Topology& t = *c.topo;
  const int h = t.host_of[c.rank], q = t.local_index[c.rank], lmin = t.min_local, l = t.local_count(h);
  std::vector<Range> blocks(l);
  for (int i = 0; i < l; ++i) blocks[i] = i < lmin ? ring_block(count, lmin, i) : Range{count, 0};
  const size_t max_block = ring_block(count, lmin, 0).count;

  const PlanContext intra = host_group(c);
  ring_reduce_scatter_blocks(intra, buf, blocks.data(), max_block);
  push_fence(c);
  if (q < lmin) {
    const std::vector<int> peers = column(t, q);
    ring_all_reduce(group_of(c, peers, h), buf + blocks[q].offset * c.elem, blocks[q].count, avg);
    push_fence(c);
  }
  ring_all_gather_blocks(intra, buf, blocks.data(), max_block);
}


// Hierarchical all-gather and reduce-scatter, on any hosts. With lmin the
// fewest ranks a host has, local index q < lmin is column q (one rank per
// host), and block (g, i) -- the block of host g's i-th rank -- travels
// across hosts in column i mod lmin, in round i / lmin (rounds: enough for
// the largest host). On even hosts that is one round, each rank carrying
// its own block.
//
// All-gather: (1) a rank past lmin hands its block to its host's column
// rank i mod lmin; (2) per column and round, an inter-host ring all-gather
// of that round's blocks (every block crosses the network once per host, in
// H-1 hops, lmin rings sharing each host's link); (3) inside each host, per
// host g and round, a ring all-gather in which column position p forwards
// block (g, round * lmin + p) and the ranks past lmin only pass blocks on.
namespace {

struct Columns {
  int lmin, rounds;
  // Block (g, i), or an empty one where host g has no rank i.
  Range block(const Topology& t, int g, int i, size_t count_per_rank) const {
    if (i >= t.local_count(g)) return {0, 0};
    return {static_cast<size_t>(t.members[g][i]) * count_per_rank, count_per_rank};
  }
  // Round k of column q across hosts: host position g holds block (g, k*lmin+q).
  // False when every block is empty (no ring to run).
  bool across(const Topology& t, int q, int k, size_t count_per_rank, std::vector<Range>& blocks) const {
    bool any = false;
    for (int g = 0; g < t.hosts; ++g) any |= (blocks[g] = block(t, g, k * lmin + q, count_per_rank)).count > 0;
    return any;
  }
  // Round k of host g's blocks inside a host of l ranks: column position p
  // holds block (g, k*lmin+p), the ranks past lmin none.
  bool inside(const Topology& t, int g, int k, int l, size_t count_per_rank, std::vector<Range>& blocks) const {
    bool any = false;
    for (int p = 0; p < l; ++p) {
      blocks[p] = p < lmin ? block(t, g, k * lmin + p, count_per_rank) : Range{0, 0};
      any |= blocks[p].count > 0;
    }
    return any;
  }
};

Columns columns_of(const Topology& t) {
  return {t.min_local, (t.max_local + t.min_local - 1) / t.min_local};
}

}  // namespace

void hierarchical_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank) {
  if (one_host(c)) {
    ring_all_gather(c, in, out, count_per_rank);
    return;
  }
  const Topology& t = *c.topo;
  const int h = t.host_of[c.rank], q = t.local_index[c.rank], hosts = t.hosts, l = t.local_count(h);
  const Columns col = columns_of(t);
  const size_t bytes = count_per_rank * c.elem;
  push_copy(c, in, out + c.rank * bytes, bytes);
  if (col.rounds > 1) {
    if (q >= col.lmin) {
      push_send(c, t.members[h][q % col.lmin], in, bytes);
    } else {
      for (int i = q + col.lmin; i < l; i += col.lmin) {
        push_recv(c, t.members[h][i], out + t.members[h][i] * bytes, bytes);
      }
    }
    push_fence(c);
  }
  std::vector<Range> blocks(std::max(hosts, l));
  if (q < col.lmin) {
    const std::vector<int> peers = column(t, q);  // outlives the context that points into it
    const PlanContext across = group_of(c, peers, h);
    for (int k = 0; k < col.rounds; ++k) {
      if (col.across(t, q, k, count_per_rank, blocks)) {
        ring_all_gather_blocks(across, out, blocks.data(), count_per_rank);
      }
    }
    push_fence(c);
  }
  const PlanContext intra = host_group(c);
  for (int g = 0; g < hosts; ++g) {
    for (int k = 0; k < col.rounds; ++k) {
      if (col.inside(t, g, k, l, count_per_rank, blocks)) {
        ring_all_gather_blocks(intra, out, blocks.data(), count_per_rank);
      }
    }
  }
}

// Reduce-scatter, the other way round, on a copy of the input in `scratch`
// (world * count_per_rank elements): (1) inside each host, per host g and
// round, a ring reduce-scatter in which column position p ends with block
// (g, round * lmin + p) summed over the host (every rank feeds its data in);
// (2) per column and round, an inter-host ring reduce-scatter of that
// round's blocks (AVG divides here, once); (3) a column rank sends each
// finished block past lmin to the rank it belongs to.
void hierarchical_reduce_scatter(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank,
                                 BufRef scratch, bool avg) {
  if (one_host(c)) {
    ring_reduce_scatter(c, in, out, count_per_rank, avg);
    return;
  }
  const Topology& t = *c.topo;
  const int h = t.host_of[c.rank], q = t.local_index[c.rank], hosts = t.hosts, l = t.local_count(h);
  const Columns col = columns_of(t);
  const size_t bytes = count_per_rank * c.elem;
  push_copy(c, in, scratch, bytes * c.world);
  std::vector<Range> blocks(std::max(hosts, l));
  const PlanContext intra = host_group(c);
  for (int g = 0; g < hosts; ++g) {
    for (int k = 0; k < col.rounds; ++k) {
      if (col.inside(t, g, k, l, count_per_rank, blocks)) {
        ring_reduce_scatter_blocks(intra, scratch, blocks.data(), count_per_rank);
      }
    }
  }
  push_fence(c);
  if (q < col.lmin) {
    const std::vector<int> peers = column(t, q);  // outlives the context that points into it
    const PlanContext across = group_of(c, peers, h);
    for (int k = 0; k < col.rounds; ++k) {
      if (col.across(t, q, k, count_per_rank, blocks)) {
        ring_reduce_scatter_blocks(across, scratch, blocks.data(), count_per_rank, avg);
      }
    }
    push_fence(c);
    for (int i = q + col.lmin; i < l; i += col.lmin) {
      push_send(c, t.members[h][i], scratch + t.members[h][i] * bytes, bytes);
    }
    push_copy(c, scratch + c.rank * bytes, out, bytes);
  } else {
    push_recv(c, t.members[h][q % col.lmin], out, bytes);
  }
}


void hierarchical_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes) {
  if (one_host(c)) {
    tree_broadcast(c, root, buf, nbytes);
    return;
  }
  const Topology& t = *c.topo;
  const int h = t.host_of[c.rank];
  const std::vector<int> leaders = leaders_of(t, root);
  if (leaders[h] == c.rank) tree_broadcast(group_of(c, leaders, h), t.host_of[root], buf, nbytes);
  push_fence(c);
  tree_broadcast(host_group(c), t.local_index[leaders[h]], buf, nbytes);
}

void hierarchical_reduce(const PlanContext& c, int root, BufRef buf, size_t count, BufRef scratch, bool avg) {
  if (one_host(c)) {
    tree_reduce(c, root, buf, count, scratch, avg);
    return;
  }
  const Topology& t = *c.topo;
  const int h = t.host_of[c.rank];
  const std::vector<int> leaders = leaders_of(t, root);
  // Inside the host first (no division: AVG divides once, at the root),
  // into the leader's scratch (a rank that is not the root keeps its buf
  // as it was); then among the leaders, into the root's buf.
  const size_t bytes = count * c.elem;
  BufRef partial = scratch + 2 * bytes;
  const bool root_here = c.rank == root;
  tree_reduce_from(host_group(c), t.local_index[leaders[h]], buf, root_here ? buf : partial, count, scratch, false);
  push_fence(c);
  if (leaders[h] == c.rank) {
    tree_reduce_from(group_of(c, leaders, h), t.host_of[root], root_here ? buf : partial, buf, count, scratch, avg);
  }
}

}  // namespace ringcomm
