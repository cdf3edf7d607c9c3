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

}  // namespace ringcomm
