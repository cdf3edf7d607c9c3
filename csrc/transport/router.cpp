#include "transport/router.h"

#include <algorithm>

namespace ringcomm {

Router::Router(int rank, int world, Transport* home) : home_(home), routes_(world, home), all_{home} {}

void Router::route(int peer, Transport* t) {
  routes_[peer] = t;
  add_transport(t);
}

void Router::add_transport(Transport* t) {
  if (std::find(all_.begin(), all_.end(), t) == all_.end()) all_.push_back(t);
}

bool Router::can_read_remote() {
  for (Transport* t : all_) {
    if (!t->can_read_remote()) return false;
  }
  return true;
}

void Router::announce_abort(const std::string& why) {
  for (Transport* t : all_) t->announce_abort(why);
}

bool Router::any_peer_aborted() {
  for (Transport* t : all_) {
    if (t->any_peer_aborted()) return true;
  }
  return false;
}

void Router::poll_peers() {
  for (Transport* t : all_) t->poll_peers();
}

void Router::announce_departure() {
  for (Transport* t : all_) t->announce_departure();
}

}  // namespace ringcomm
