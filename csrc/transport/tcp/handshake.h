// Connection set-up for the TCP transport: the higher rank of each pair
// dials the lower one's listener; each side presents the secret and a Hello
// (wire.h) and checks the other's before the connection is used.
#pragma once

#include <string>
#include <vector>

#include "transport/tcp/socket.h"

namespace ringcomm {
namespace tcp {

struct Identity {
  int rank;
  int world;
  size_t slot_bytes;
  int nslots;
  std::string secret;  // kSecretBytes bytes
};

// Connects to `peer` at host:port and completes the handshake; throws Error
// (TimeoutError past `deadline`) naming the peer and what failed.
Fd dial(const Identity& me, int peer, const std::string& host, int port, Clock::time_point deadline);

// Accepts connections on `listener` until every rank in `expected` has
// completed the handshake; returns their sockets, indexed by rank. A
// connection that presents a wrong secret (or sends it too slowly, or a bad
// Hello) is closed at once and does not delay the others. Throws
// TimeoutError past `deadline`, naming the ranks still missing and the last
// connection that was turned away.
std::vector<Fd> accept_peers(int listener, const Identity& me, const std::vector<bool>& expected,
                             Clock::time_point deadline);

}  // namespace tcp
}  // namespace ringcomm
