// Small POSIX socket helpers for the TCP transport: an owning descriptor,
// listen / connect with deadlines, and exact reads / writes that wait with
// poll() so that no call blocks past its deadline.
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

// A connected, non-blocking socket to host:port (numeric address or name),
// or an invalid Fd with *error set. Retries refused connections until
// `deadline` (the listener may not be up yet).
Fd connect_to(const std::string& host, int port, Clock::time_point deadline, std::string* error);

// Accepts one pending connection (non-blocking, close-on-exec), or an invalid Fd.
Fd accept_from(int listener);

void set_nodelay(int fd);

// What read_exact returns when the other end closed the connection.
constexpr const char* kClosedByPeer = "connection closed by the other end";

// Exact transfers on a non-blocking socket, waiting in poll() until `deadline`.
// Return "" on success, otherwise what went wrong ("timed out", kClosedByPeer,
// strerror).
std::string read_exact(int fd, void* buf, size_t n, Clock::time_point deadline);
std::string write_all(int fd, const void* buf, size_t n, Clock::time_point deadline);

// "10.0.0.2:41234" for the far end of a connected socket.
std::string peer_name(int fd);

}  // namespace tcp
}  // namespace ringcomm
