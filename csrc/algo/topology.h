// Who runs where: the ranks of a communicator grouped by host. Pure data,
// the same on every rank (built from the host census), read by the
// hierarchical schedules and the cost model.
#pragma once

#include <vector>

namespace ringcomm {

struct Topology {
  std::vector<int> host_of;               // rank -> host, hosts numbered in the order of their lowest rank
  std::vector<std::vector<int>> members;  // host -> its ranks, ascending
  std::vector<int> local_index;           // rank -> its index among its host's ranks
  std::vector<int> ring;                  // host-contiguous order (position -> rank)
  int hosts = 1;
  int min_local = 1, max_local = 1;
  int world() const { return static_cast<int>(host_of.size()); }
  int local_count(int host) const { return static_cast<int>(members[host].size()); }
  // From any labelling of the ranks' hosts (equal labels: one host).
  static Topology from_hosts(const std::vector<int>& host_label);
  // `hosts` hosts of `per_host` ranks each, ranks host-contiguous.
  static Topology uniform(int hosts, int per_host);
};

}  // namespace ringcomm
