// Schedules: pure functions that append the Steps of one call to a Schedule.
// They name peers by rank and buffers by BufRef (algo/step.h: which of the
// call's buffers, and where in it); they never see a transport or an address.
#pragma once

#include <cstddef>

#include "algo/blocks.h"
#include "algo/step.h"
#include "algo/topology.h"

namespace ringcomm {

// Which family of schedules a call runs; carried in every message header
// (MsgTag::algo), because all ranks of a call must run the same one.
enum ScheduleFamily : uint8_t {
  kFamilyFifo = 0,
  kFamilyRing = 1,
  kFamilyOneShot = 2,
  kFamilyPull = 3,
  kFamilyRecursiveDoubling = 4,
  kFamilyTree = 5,
  kFamilyRabenseifner = 6,
  kFamilyBruck = 7,
  kFamilyHierarchical = 8,
  kFamilyDirect = 9,
};

// A family's name as RINGCOMM_ALGO spells it ("fifo": the ops' plain FIFO
// schedules; "?": no family), for messages and the plan checker.
inline const char* schedule_family_name(ScheduleFamily f) {
  switch (f) {
    case kFamilyFifo: return "fifo";
    case kFamilyRing: return "ring";
    case kFamilyOneShot: return "oneshot";
    case kFamilyPull: return "pull";
    case kFamilyRecursiveDoubling: return "recursive_doubling";
    case kFamilyTree: return "tree";
    case kFamilyRabenseifner: return "rabenseifner";
    case kFamilyBruck: return "bruck";
    case kFamilyHierarchical: return "hierarchical";
    case kFamilyDirect: return "direct";
  }
  return "?";
}

struct PlanContext {
  int rank;
  int world;
  size_t elem;         // bytes per element
  size_t slice_elems;  // ring schedules: elements of each block moved per round
  Schedule* out;
  // Ring and chain schedules: the ring's order (position -> rank, world
  // entries) and this rank's position in it; null: rank order. Ranks of one
  // host sit next to each other, so that only one link per host boundary
  // crosses the network whatever the rank placement (comm/ sets it from the
  // host census; every rank derives the same order).
  const int* ring = nullptr;
  int ring_pos = 0;
  // A group of the communicator's ranks (hierarchical schedules' phases):
  // rank and world are this rank's index in the group and its size, peers
  // are named by group index, and push_step maps index i to rank members[i].
  const int* members = nullptr;
  // Hierarchical schedules: who runs where (null: one host).
  const Topology* topo = nullptr;
  // Two ranks: rooted calls' schedules make both ranks hear from each other
  // (plan_call, comm/call_plan.cpp), so that the headers checked on every
  // message stand in for the agreement round (comm/communicator_agree.cpp).
  bool mutual_pair = false;
  // More than two ranks: the tree family's rooted calls take their covering
  // form (covering_tree_broadcast / covering_tree_reduce), whose checked
  // headers stand in for the agreement round the same way.
  bool covering = false;
};

// The rank at ring position `pos` (any integer, taken mod world), and this
// rank's position.
inline int ring_rank(const PlanContext& c, int pos) {
  const int p = ((pos % c.world) + c.world) % c.world;
  return c.ring ? c.ring[p] : p;
}
inline int ring_position(const PlanContext& c) { return c.ring ? c.ring_pos : c.rank; }

// Pull schedules: rank r's entry of the address table (kAddrs, world
// entries): this rank publishes its own address in its entry, each peer's
// arrives in the peer's.
inline BufRef addr_entry(int r) { return {kAddrs, static_cast<uint64_t>(r) * sizeof(uint64_t)}; }

// Ring (bandwidth optimal, 2(n-1) steps per round).
void ring_all_reduce(const PlanContext& c, BufRef buf, size_t count, bool avg);
void ring_reduce_scatter(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank,
                         bool avg);
void ring_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank);

// The ring's two parts in place over any block layout (position q of the
// ring finishes blocks[q], n entries; max_block: the largest count).
void ring_reduce_scatter_blocks(const PlanContext& c, BufRef buf, const Range* blocks, size_t max_block,
                                bool avg = false);
void ring_all_gather_blocks(const PlanContext& c, BufRef buf, const Range* blocks, size_t max_block);

// Hierarchical all-reduce over c.topo (algo/hierarchical.cpp): intra-host
// reduce-scatter, inter-host ring all-reduce among the ranks of equal local
// index (all at once), intra-host all-gather; any ranks per host.
void hierarchical_all_reduce(const PlanContext& c, BufRef buf, size_t count, bool avg);
// Any hosts: inter-host rings per column of local indices and intra-host
// rings per host, in ceil(max_local / min_local) rounds (see
// algo/hierarchical.cpp); the reduce-scatter's `scratch` holds the input
// (world * count_per_rank elements).
void hierarchical_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank);
void hierarchical_reduce_scatter(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank,
                                 BufRef scratch, bool avg);
// Trees of trees: a binomial tree among one rank per host (the root on its
// host, the lowest rank on the others), then one inside every host; the
// reduce runs the other way. The reduce's `scratch` holds 3 * count elements.
void hierarchical_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes);
void hierarchical_reduce(const PlanContext& c, int root, BufRef buf, size_t count, BufRef scratch, bool avg);

// One shot (latency optimal for small messages): every rank receives every
// input and reduces them itself in rank order, so all ranks get the same bits.
// `scratch` holds world * count elements.
void oneshot_all_reduce(const PlanContext& c, BufRef buf, size_t count, BufRef scratch, bool avg);

// Recursive doubling (latency optimal: log2 p whole-buffer exchanges, with the
// fix-up for non-powers of two); `scratch` holds count elements.
void recursive_doubling_all_reduce(const PlanContext& c, BufRef buf, size_t count, BufRef scratch, bool avg);
// Rabenseifner (reduce-scatter by recursive halving, all-gather by recursive
// doubling: bandwidth-lean for medium messages); `scratch` holds count elements.
void rabenseifner_all_reduce(const PlanContext& c, BufRef buf, size_t count, BufRef scratch, bool avg);

// Bruck's all-gather (ceil(log2 n) steps for any n, blocks received in place).
void bruck_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank);

// Binomial trees rooted at `root` (ceil(log2 n) hops); the reduce's
// `scratch` holds 2 * count elements.
void tree_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes);
void tree_reduce(const PlanContext& c, int root, BufRef buf, size_t count, BufRef scratch, bool avg);
// The same from `in`, the root's result to `out` (only the root writes it).
void tree_reduce_from(const PlanContext& c, int root, BufRef in, BufRef out, size_t count, BufRef scratch,
                      bool avg);

// The binomial trees above with distances growing instead (round k: v and
// v + 2^k, relative to the root), completed into the dissemination pattern:
// in round k every rank sends to the rank 2^k after it (the reduce: before
// it) and receives from the one 2^k before it (after it), an empty message
// where the tree moves nothing, and starts round k+1 only then. After
// ceil(log2 n) rounds every rank has heard, through a chain of messages
// whose headers were checked against the receiver's call, from every rank:
// ranks that disagree on the call all raise before any returns, without the
// agreement's own rounds. The reduce's `scratch` holds 2 * count elements.
void covering_tree_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes);
void covering_tree_reduce(const PlanContext& c, int root, BufRef buf, size_t count, BufRef scratch, bool avg);

// Chains along the ring starting at the root (pipelined through the FIFOs).
void chain_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes);
void chain_reduce(const PlanContext& c, int root, BufRef buf, size_t count, bool avg);

// Direct exchanges.
void direct_scatter(const PlanContext& c, int root, BufRef in, BufRef out, size_t nbytes_per_rank);
void direct_gather(const PlanContext& c, int root, BufRef in, BufRef out, size_t nbytes_per_rank);
void pairwise_all_to_all(const PlanContext& c, BufRef in, BufRef out, size_t nbytes_per_rank);
// Every rank sends its block straight to every other (one round, no
// forwarding: latency optimal, and the fewest wake-ups where ranks share
// cores).
void direct_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t nbytes_per_rank);
void dissemination_barrier(const PlanContext& c);
// The dissemination barrier carrying two words a rank, reduced by the run's
// reducer (Communicator::agree_on_call: a minimum) as they spread.
// `state`: four words (kState), this rank's pair first; returns where the
// result is.
BufRef dissemination_agreement(const PlanContext& c, BufRef state);

// Pull (single copy: peers read each other's buffers, see algo/pull.cpp).
void pull_all_reduce(const PlanContext& c, BufRef buf, size_t count, bool avg);
void pull_reduce_scatter(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank, bool avg);
void pull_all_gather(const PlanContext& c, BufRef in, BufRef out, size_t count_per_rank);
void pull_broadcast(const PlanContext& c, int root, BufRef buf, size_t nbytes);
void pull_reduce_to_root(const PlanContext& c, int root, BufRef buf, size_t count, bool avg);
void pull_scatter(const PlanContext& c, int root, BufRef in, BufRef out, size_t nbytes_per_rank);
void pull_gather(const PlanContext& c, int root, BufRef in, BufRef out, size_t nbytes_per_rank);
void pull_all_to_all(const PlanContext& c, BufRef in, BufRef out, size_t nbytes_per_rank);
void pull_send(const PlanContext& c, int peer, BufRef buf);
void pull_recv(const PlanContext& c, int peer, BufRef buf, size_t nbytes);

// Point to point.
void p2p_send(const PlanContext& c, int peer, BufRef buf, size_t nbytes);
void p2p_recv(const PlanContext& c, int peer, BufRef buf, size_t nbytes);

}  // namespace ringcomm
