// The cost model that picks a schedule family for `auto` and explains why
// (ringcomm.explain, ringcomm-bench --explain / --simulate).
//
// Hockney's alpha-beta model with a reduction term, after Thakur,
// Rabenseifner and Gropp (2005): a message of m bytes over a link of kind k
// costs alpha_k + m * beta_k, reducing m bytes costs m * gamma. Two link
// kinds: "intra" (ranks of one host, shared memory) and "inter" (different
// hosts, TCP). A step of a schedule, in which many ranks send at once, costs
// as much as its slowest transfer: the inter link if any pair of the step is
// on two hosts, with beta multiplied by the largest number of this step's
// cross-host transfers leaving one host, divided among its `nics`
// independent network links (ceil(streams / nics) share the busiest one).
// Each family's time is then affine in the message size, T(S) = A + B * S:
// both terms come from walking its schedule's steps over the real rank ->
// host map once per topology (exact for interleaved placements, uneven hosts
// and non-powers of two), so picking for a call is two multiplications per
// candidate.
//
// Everything here is pure arithmetic over what every rank knows alike (the
// topology, the agreed parameters): all ranks pick the same family.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "algo/topology.h"
#include "comm/algo_choice.h"
#include "comm/describe.h"

namespace ringcomm {

struct LinkCost {
  double alpha = 0;     // seconds: one message's latency (half a round trip)
  double beta = 0;      // seconds per byte of one stream
  double overhead = 0;  // seconds a rank spends issuing each further message of a step
};

// A family's formula corrected by measurement (ringcomm-bench --calibrate
// times each family at a few sizes): at each measured size the ratio of the
// measured time to the formula's, in between interpolated in log(size),
// beyond the ends the nearest ratio. The formulas know a schedule's shape,
// not what the machine does with it (a ring's steps overlapping one another,
// eight ranks sharing two cores, a socket buffer's size): the ratios say
// by how much, per family, on the topology they were measured on.
struct FamilyFit {
  OpKind kind;
  Algo algo;
  std::vector<std::pair<double, double>> points;  // (bytes, measured / formula), bytes ascending
  double ratio(double bytes) const;
};

struct CostParams {
  LinkCost intra;       // ranks of one host
  LinkCost inter;       // ranks of different hosts
  double gamma = 0;     // seconds per byte reduced
  std::vector<FamilyFit> fits;  // empty: the formulas as they are
  int fit_world = 0, fit_hosts = 0;  // the topology the fits were measured on
  // Independent inter-host links per host: 1 for a host with one network
  // port (every cross-host transfer of its ranks shares it), 8 for a DGX
  // node with one NIC per GPU. Each rank's transfers take one link.
  int nics = 1;
  std::string source;   // "default", "measured" or the file it came from
};

// What ringcomm assumes before (or instead of) measuring: measured on the
// 2-core machines of this project (see docs/algorithms.md, "The cost model").
CostParams default_cost_params();

// How a call may be run: the limits the communicator plans with.
struct ModelLimits {
  size_t slot_bytes = 128 * 1024;     // chain pipeline segment
  size_t oneshot_max_bytes = 1 << 20; // one-shot needs world * S of scratch: not beyond this
  bool check_agreement = true;        // rooted calls first run the agreement check (Communicator::agree_on_call)
};

struct Prediction {
  Algo algo;
  double seconds;
};

// A family's cost as T(S) = a + b * S (chain schedules add a pipeline fill
// term, see cost_model.cpp).
struct Affine {
  double a = 0, b = 0;
};

class CostModel {
 public:
  CostModel() = default;
  CostModel(Topology topo, CostParams params, ModelLimits limits);

  // Every family `kind` can run here with its predicted seconds for a call
  // of `nbytes` (the size nccl-tests reports: the buffer of all_reduce,
  // broadcast and reduce, all ranks' data for reduce_scatter, all_gather,
  // scatter, gather and all_to_all), fastest first.
  std::vector<Prediction> predict(OpKind kind, size_t nbytes) const;
  // The fastest (what `auto` runs).
  Algo pick(OpKind kind, size_t nbytes) const;
  double seconds(OpKind kind, Algo algo, size_t nbytes) const;
  const Topology& topology() const { return topo_; }
  const CostParams& params() const { return params_; }
  const ModelLimits& limits() const { return limits_; }

 private:
  struct Entry {
    OpKind kind;
    Algo algo;
    Affine cost;
    int fit = -1;  // its correction in params_.fits, if any
    int fill_hops = 0;  // chains: hops that add the pipeline fill of one slot (at cost.b per byte)
    size_t max_bytes = SIZE_MAX;  // not a candidate above this size
  };
  void build();
  double eval(const Entry& e, size_t nbytes) const;

  Topology topo_;
  CostParams params_;
  ModelLimits limits_;
  std::vector<Entry> entries_;
};

}  // namespace ringcomm
