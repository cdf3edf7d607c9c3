// Routes each peer to the transport that connects it (shared memory for
// ranks of this host, sockets for the others) and presents them to the
// executor as one Transport. Waiting always happens on the shared-memory
// doorbell of this rank: other transports ring it (Transport::wake) when
// data arrives, so one futex covers every peer.
#pragma once

#include <vector>

#include "transport/transport.h"

namespace ringcomm {

class Router : public Transport {
 public:
  Router(int rank, int world, Transport* home);

  // Peer `peer` is reached through `t` from now on.
  void route(int peer, Transport* t);
  Transport* route_of(int peer) const { return routes_[peer]; }
  // Every transport in use (home first), for aborts.
  void add_transport(Transport* t);

  Link* link(int peer) override { return routes_[peer]->link(peer); }
  void sleep(Clock::time_point until, const std::function<bool()>& recheck) override {
    home_->sleep(until, recheck);
  }
  void wake() override { home_->wake(); }
  bool can_read_remote() override;
  void announce_abort(const std::string& why) override;
  std::string peer_abort_reason(int peer) override { return routes_[peer]->peer_abort_reason(peer); }
  std::string local_abort_reason() override { return home_->local_abort_reason(); }
  void poll_peers() override;
  std::string peer_gone(int peer) override { return routes_[peer]->peer_gone(peer); }
  bool any_peer_aborted() override;
  void announce_departure() override;
  void release_refs() override {
    for (Transport* t : all_) t->release_refs();
  }
  void record_call(const CallRecordView& call) override {
    for (Transport* t : all_) t->record_call(call);
  }
  void request_peer_calls() override {
    for (Transport* t : all_) t->request_peer_calls();
  }
  bool peer_call(int peer, bool p2p, CallRecordView* out) override { return routes_[peer]->peer_call(peer, p2p, out); }

 private:
  Transport* home_;
  std::vector<Transport*> routes_;
  std::vector<Transport*> all_;
};

}  // namespace ringcomm
