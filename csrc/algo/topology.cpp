#include "algo/topology.h"

#include <algorithm>
#include <map>

namespace ringcomm {

Topology Topology::from_hosts(const std::vector<int>& label) {
  Topology t;
  const int n = static_cast<int>(label.size());
  std::map<int, int> index;  // label -> host number
  t.host_of.resize(n);
  t.local_index.resize(n);
  for (int r = 0; r < n; ++r) {
    auto it = index.find(label[r]);
    if (it == index.end()) {
      it = index.emplace(label[r], static_cast<int>(t.members.size())).first;
      t.members.emplace_back();
    }
    t.host_of[r] = it->second;
    t.local_index[r] = static_cast<int>(t.members[it->second].size());
    t.members[it->second].push_back(r);
  }
  t.hosts = std::max(1, static_cast<int>(t.members.size()));
  if (t.members.empty()) t.members.emplace_back();
  t.min_local = n;
  t.max_local = 0;
  for (const auto& m : t.members) {
    t.ring.insert(t.ring.end(), m.begin(), m.end());
    t.min_local = std::min(t.min_local, static_cast<int>(m.size()));
    t.max_local = std::max(t.max_local, static_cast<int>(m.size()));
  }
  return t;
}

Topology Topology::uniform(int hosts, int per_host) {
  std::vector<int> label(static_cast<size_t>(hosts) * per_host);
  for (size_t r = 0; r < label.size(); ++r) label[r] = static_cast<int>(r) / per_host;
  return from_hosts(label);
}

}  // namespace ringcomm
