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

void hierarchical_all_reduce(const PlanContext& c, char* buf, size_t count, bool avg) {
  const Topology* t = c.topo;
  if (t == nullptr || t->hosts == 1 || t->world() != c.world) {
    ring_all_reduce(c, buf, count, avg);  // one host: the hierarchy is the ring
    return;
  }
  const int h = t->host_of[c.rank], q = t->local_index[c.rank], lmin = t->min_local;
  const std::vector<int>& local = t->members[h];
  const int l = static_cast<int>(local.size());
  std::vector<Range> blocks(l);
  for (int i = 0; i < l; ++i) blocks[i] = i < lmin ? ring_block(count, lmin, i) : Range{count, 0};
  const size_t max_block = ring_block(count, lmin, 0).count;

  PlanContext intra = c;
  intra.rank = q;
  intra.world = l;
  intra.members = local.data();
  intra.ring = nullptr;
  intra.ring_pos = 0;
  intra.topo = nullptr;
  ring_reduce_scatter_blocks(intra, buf, blocks.data(), max_block);
  push_fence(c);
  if (q < lmin) {
    std::vector<int> peers(t->hosts);
    for (int g = 0; g < t->hosts; ++g) peers[g] = t->members[g][q];
    PlanContext cross = intra;
    cross.rank = h;
    cross.world = t->hosts;
    cross.members = peers.data();
    ring_all_reduce(cross, buf + blocks[q].offset * c.elem, blocks[q].count, avg);
    push_fence(c);
  }
  ring_all_gather_blocks(intra, buf, blocks.data(), max_block);
}

namespace {

// Even hosts (every host the same number of ranks): the column layout of
// all_gather / reduce_scatter, rank (host g, local index q) at g, q.
bool even_hosts(const PlanContext& c) {
  return c.topo != nullptr && c.topo->hosts > 1 && c.topo->world() == c.world &&
         c.topo->min_local == c.topo->max_local;
}

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

}  // namespace

// Hierarchical all-gather (even hosts): an inter-host ring all-gather among
// the ranks of equal local index q (each gets the blocks of every host's
// q-th rank), then, inside each host, one ring all-gather per host g of its
// q-th ranks' blocks (position q forwards block (g, q)): every block crosses
// the network once per host, in H-1 hops, and the host's links carry
// L rings at once.
void hierarchical_all_gather(const PlanContext& c, const char* in, char* out, size_t count_per_rank) {
  if (!even_hosts(c)) {
    ring_all_gather(c, in, out, count_per_rank);
    return;
  }
  const Topology& t = *c.topo;
  const int h = t.host_of[c.rank], q = t.local_index[c.rank], hosts = t.hosts, l = t.local_count(h);
  const size_t bytes = count_per_rank * c.elem;
  push_copy(c, in, out + c.rank * bytes, bytes);
  std::vector<int> column(hosts);
  for (int g = 0; g < hosts; ++g) column[g] = t.members[g][q];
  std::vector<Range> blocks(std::max(hosts, l));
  for (int g = 0; g < hosts; ++g) blocks[g] = {static_cast<size_t>(column[g]) * count_per_rank, count_per_rank};
  ring_all_gather_blocks(group_of(c, column, h), out, blocks.data(), count_per_rank);
  push_fence(c);
  const PlanContext intra = group_of(c, t.members[h], q);
  for (int g = 0; g < hosts; ++g) {
    for (int i = 0; i < l; ++i) blocks[i] = {static_cast<size_t>(t.members[g][i]) * count_per_rank, count_per_rank};
    ring_all_gather_blocks(intra, out, blocks.data(), count_per_rank);
  }
}

// Hierarchical reduce-scatter (even hosts), the other way round: inside
// each host one ring reduce-scatter per host g (position q ends with block
// (g, q) summed over the host), then an inter-host ring reduce-scatter among
// the ranks of equal local index over their column of blocks. It works on a
// copy of the input in `scratch` (world * count_per_rank elements).
void hierarchical_reduce_scatter(const PlanContext& c, const char* in, char* out, size_t count_per_rank,
                                 char* scratch, bool avg) {
  if (!even_hosts(c)) {
    ring_reduce_scatter(c, in, out, count_per_rank, avg);
    return;
  }
  const Topology& t = *c.topo;
  const int h = t.host_of[c.rank], q = t.local_index[c.rank], hosts = t.hosts, l = t.local_count(h);
  const size_t bytes = count_per_rank * c.elem;
  push_copy(c, in, scratch, bytes * c.world);
  std::vector<Range> blocks(std::max(hosts, l));
  const PlanContext intra = group_of(c, t.members[h], q);
  for (int g = 0; g < hosts; ++g) {
    for (int i = 0; i < l; ++i) blocks[i] = {static_cast<size_t>(t.members[g][i]) * count_per_rank, count_per_rank};
    ring_reduce_scatter_blocks(intra, scratch, blocks.data(), count_per_rank);
  }
  push_fence(c);
  std::vector<int> column(hosts);
  for (int g = 0; g < hosts; ++g) column[g] = t.members[g][q];
  for (int g = 0; g < hosts; ++g) blocks[g] = {static_cast<size_t>(column[g]) * count_per_rank, count_per_rank};
  ring_reduce_scatter_blocks(group_of(c, column, h), scratch, blocks.data(), count_per_rank, avg);
  push_fence(c);
  push_copy(c, scratch + c.rank * bytes, out, bytes);
}

namespace {

// The two levels of the trees: this rank's host group (its leader: the root
// on the root's host, the lowest rank elsewhere, at group index 0 or the
// root's own index) and the leaders' group, one rank per host.
struct Levels {
  PlanContext intra, cross;
  int intra_root = 0, cross_root = 0;
  bool leader = false;
  std::vector<int> leaders;
};

void levels_of(const PlanContext& c, int root, Levels* lv) {
  const Topology& t = *c.topo;
  const int h = t.host_of[c.rank], root_host = t.host_of[root];
  lv->leaders.resize(t.hosts);
  for (int g = 0; g < t.hosts; ++g) lv->leaders[g] = g == root_host ? root : t.members[g][0];
  lv->leader = lv->leaders[h] == c.rank;
  lv->intra = c;
  lv->intra.rank = t.local_index[c.rank];
  lv->intra.world = t.local_count(h);
  lv->intra.members = t.members[h].data();
  lv->intra.ring = nullptr;
  lv->intra.ring_pos = 0;
  lv->intra.topo = nullptr;
  lv->intra_root = t.local_index[lv->leaders[h]];
  lv->cross = lv->intra;
  lv->cross.rank = h;
  lv->cross.world = t.hosts;
  lv->cross.members = lv->leaders.data();
  lv->cross_root = root_host;
}

bool one_host(const PlanContext& c) { return c.topo == nullptr || c.topo->hosts == 1 || c.topo->world() != c.world; }

}  // namespace

void hierarchical_broadcast(const PlanContext& c, int root, char* buf, size_t nbytes) {
  if (one_host(c)) {
    tree_broadcast(c, root, buf, nbytes);
    return;
  }
  Levels lv;
  levels_of(c, root, &lv);
  if (lv.leader) tree_broadcast(lv.cross, lv.cross_root, buf, nbytes);
  push_fence(c);
  tree_broadcast(lv.intra, lv.intra_root, buf, nbytes);
}

void hierarchical_reduce(const PlanContext& c, int root, char* buf, size_t count, char* scratch, bool avg) {
  if (one_host(c)) {
    tree_reduce(c, root, buf, count, scratch, avg);
    return;
  }
  Levels lv;
  levels_of(c, root, &lv);
  // Inside the host first (no division: AVG divides once, at the root),
  // into the leader's scratch (a rank that is not the root keeps its buf
  // as it was); then among the leaders, into the root's buf.
  const size_t bytes = count * c.elem;
  char* partial = scratch + 2 * bytes;
  const bool root_here = c.rank == root;
  tree_reduce_from(lv.intra, lv.intra_root, buf, root_here ? buf : partial, count, scratch, false);
  push_fence(c);
  if (lv.leader) tree_reduce_from(lv.cross, lv.cross_root, root_here ? buf : partial, buf, count, scratch, avg);
}

}  // namespace ringcomm
