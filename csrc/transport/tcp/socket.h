// Small POSIX socket helpers for the TCP transport: an owning descriptor,
// a listener, and a connect that never blocks (connector.h waits for all of
// them at once).
#pragma once

#include <string>

#include "transport/transport.h"

namespace ringcomm {
namespace tcp {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

std::string errno_text(int err);

// A non-blocking listening socket on `host` (a numeric IPv4 or IPv6 address;
// "" for every IPv4 interface), on a port the kernel picks; *port gets it.
// Its accept queue is as long as the kernel allows (net.core.somaxconn), so
// strangers that connect before the rank accepts do not crowd a real peer's
// connection out of it (the kernel would drop its SYN, and its connect would
// wait for a retransmission).
Fd listen_on(const std::string& host, int* port);

// The first step of a connection that the caller completes without blocking
// (TCP's connect, then the handshake, from one poll loop: connector.h): a
// non-blocking socket whose connect() to host:port is under way or done, or
// an invalid Fd with *error set. A refusal is not retried: every rank listens
// before its address is published, so a refused connection means the
// listener is gone.
Fd start_connect(const std::string& host, int port, std::string* error);
// 0 once a connect started by start_connect has succeeded, else its errno.
int connect_error(int fd);

// Accepts one pending connection (non-blocking, close-on-exec), or an invalid Fd.
Fd accept_from(int listener);

void set_nodelay(int fd);

// How a connection that the other end closed is reported.
constexpr const char* kClosedByPeer = "connection closed by the other end";

// "10.0.0.2:41234" for the far end of a connected socket.
std::string peer_name(int fd);

}  // namespace tcp
}  // namespace ringcomm
