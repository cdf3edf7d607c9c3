// Set-up: the shared-memory inbox and the TCP links (the store exchange is
// in Python), the ring order, the topology and the cost model over them,
// and which transport reaches which peer.
#include "comm/communicator.h"

#include <algorithm>

namespace ringcomm {

// Large sends pull where every rank can (the sender picks the form of each
// message, the receiver follows it: comm/p2p_match.cpp).
void Communicator::set_pull(bool on) {
  pull_ok_ = on && config_.pull;
  memo_.valid = false;  // resolve_algo's answers depend on it
  check_memo_.call.plan = nullptr;
  matcher_.set_pull(pull_ok_, algos_.forces_pull_everywhere ? 0 : config_.pull_min_bytes);
}

std::string Communicator::create_segment(const std::vector<int>& members) {
  if (std::find(members.begin(), members.end(), rank_) == members.end()) {
    throw Error("ringcomm: create_segment: this rank is not among the members");
  }
  return shm_->create_inbox(members);
}

void Communicator::connect(const std::vector<std::string>& names) {
  shm_->connect(names);
  executor_.forget_links();
}

void Communicator::set_ring_order(const std::vector<int>& order) {
  if (static_cast<int>(order.size()) != world_) {
    throw ValueError("ring order: " + std::to_string(order.size()) + " ranks for a communicator of " +
                     std::to_string(world_));
  }
  std::vector<char> seen(world_, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    const int r = order[i];
    if (r < 0 || r >= world_ || seen[r]) throw ValueError("ring order: not a permutation of the ranks");
    seen[r] = 1;
    if (r == rank_) ring_pos_ = static_cast<int>(i);
  }
  ring_order_ = order;
  ring_identity_ = true;
  for (int i = 0; i < world_; ++i) ring_identity_ = ring_identity_ && order[i] == i;
  topo_.ring = ring_order_;
  plan_cache_.clear();  // plans of the old order (memo_ too: the cache's generation moves)
  rebuild_model(model_.params());
}

void Communicator::set_topology(const std::vector<int>& labels) {
  if (static_cast<int>(labels.size()) != world_) {
    throw ValueError("topology: " + std::to_string(labels.size()) + " host labels for a communicator of " +
                     std::to_string(world_));
  }
  topo_ = Topology::from_hosts(labels);
  topo_.ring = ring_order_;  // the order the rings really run in (set_ring_order)
  plan_cache_.clear();       // plans of the old topology
  rebuild_model(model_.params());
}

void Communicator::set_cost_params(const CostParams& p) { rebuild_model(p); }

// The model over the current topology and parameters. Every call's family
// is the chooser's pick (resolve_algo), small synchronous all_reduce calls
// included: they run the one-shot plan when the model picks it.
void Communicator::rebuild_model(CostParams params) {
  ModelLimits lim;
  lim.slot_bytes = config_.slot_bytes;
  lim.oneshot_max_bytes = config_.oneshot_max_bytes;
  lim.check_agreement = config_.check_agreement;
  model_ = CostModel(topo_, std::move(params), lim);
  tuner_.reset();       // its checks compare with the old model's predictions
  memo_.valid = false;  // picks of the old model
  check_memo_.call.plan = nullptr;
}

void Communicator::finish_init() {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    const bool by_tcp = tcp_ && tcp_->reaches(p);
    if (!by_tcp && !shm_->reaches(p)) {
      throw Error("ringcomm: rank " + std::to_string(rank_) + " has no way to reach rank " + std::to_string(p) +
                  " (no shared segment and no TCP connection): the ranks' records in the store disagree");
    }
  }
}

int Communicator::listen_tcp(const std::string& host) {
  if (!tcp_) tcp_ = std::make_unique<TcpTransport>(rank_, world_, config_.slot_bytes, config_.nslots, shm_.get());
  return tcp_->listen(host);
}

void Communicator::connect_tcp(const std::vector<std::string>& hosts, const std::vector<int>& ports,
                               const std::string& secret) {
  if (!tcp_) throw Error("ringcomm: connect_tcp before listen_tcp");
  if (std::all_of(hosts.begin(), hosts.end(), [](const std::string& h) { return h.empty(); })) {
    tcp_.reset();  // every peer shares memory with this rank
    return;
  }
  // TCP links are made when a schedule first uses them (tcp_transport.h);
  // the ring's neighbours are used by nearly every schedule family (ring,
  // chain, and the hops between hosts of the others), so they are connected
  // now, in parallel, and a peer that is gone shows at init. Both ends of a
  // ring edge see it in the same ring order.
  std::vector<int> now;
  const int n = static_cast<int>(ring_order_.size());
  const int pos = static_cast<int>(std::find(ring_order_.begin(), ring_order_.end(), rank_) - ring_order_.begin());
  for (int step : {n - 1, 1}) {
    const int p = ring_order_[(pos + step) % n];
    if (p != rank_ && !hosts[p].empty() && std::find(now.begin(), now.end(), p) == now.end()) now.push_back(p);
  }
  tcp_->connect(hosts, ports, secret, now, deadline_from_now(),
                std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config_.timeout_s)));
  for (int p = 0; p < world_; ++p) {
    if (tcp_->reaches(p)) router_.route(p, tcp_.get());
  }
  executor_.forget_links();
}

std::string Communicator::transport_of(int peer) const {
  check_rank(peer, world_, "peer");
  if (peer == rank_) return "self";
  return tcp_ && tcp_->reaches(peer) ? "tcp" : "shm";
}

}  // namespace ringcomm
