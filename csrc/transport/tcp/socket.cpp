#include "transport/tcp/socket.h"

#include <algorithm>

#include "ringcomm/interrupt.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ringcomm/types.h"

namespace ringcomm {
namespace tcp {
namespace {

int poll_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(left + 1, 1000)));
}

// Waits until `fd` is ready for `events` or the deadline passes; false on timeout.
// Polls in slices of kInterruptPoll so that Ctrl-C stops a connect or a
// handshake read (Interrupted) rather than waiting up to the deadline.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  Clock::time_point last{};
  for (;;) {
    struct pollfd p{fd, events, 0};
    const Clock::time_point slice = std::min(deadline, Clock::now() + kInterruptPoll);
    int r = ::poll(&p, 1, poll_ms(slice));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // let the caller's call report the error
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    check_interrupted(now, &last, [] { return "connecting to a TCP peer"; });
  }
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string errno_text(int err) { return std::strerror(err); }

Fd listen_on(const std::string& host, int* port) {
  struct addrinfo hints{};
  hints.ai_family = host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  struct addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &res);
  if (rc != 0) {
    throw Error("ringcomm: cannot listen on '" + host + "': " + gai_strerror(rc) +
                " (expected a numeric IP address of this host)");
  }
  std::string why;
  for (struct addrinfo* a = res; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd.valid()) {
      why = errno_text(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 4096) != 0) {
      why = errno_text(errno);
      continue;
    }
    struct sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&ss), &len);
    *port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&ss)->sin6_port)
                                     : ntohs(reinterpret_cast<struct sockaddr_in*>(&ss)->sin_port);
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  throw Error("ringcomm: cannot listen on '" + host + "': " + why);
}

Fd connect_to(const std::string& host, int port, Clock::time_point deadline, std::string* error) {
  struct addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    *error = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    return Fd();
  }
  auto backoff = std::chrono::milliseconds(5);
  for (;;) {
    for (struct addrinfo* a = res; a; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd.valid()) {
        *error = errno_text(errno);
        continue;
      }
      set_nodelay(fd.get());
      int r = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      if (r != 0 && errno == EINPROGRESS) {
        if (!wait_for(fd.get(), POLLOUT, deadline)) {
          *error = "connection attempt timed out";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        r = err == 0 ? 0 : -1;
        errno = err;
      }
      if (r == 0) {
        ::freeaddrinfo(res);
        return fd;
      }
      *error = errno_text(errno);
    }
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::milliseconds(200));
  }
  ::freeaddrinfo(res);
  return Fd();
}

Fd accept_from(int listener) {
  int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd >= 0) set_nodelay(fd);
  return Fd(fd);
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string read_exact(int fd, void* buf, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t got = ::recv(fd, p, n, 0);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return kClosedByPeer;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_text(errno);
    if (!wait_for(fd, POLLIN, deadline)) return "timed out";
  }
  return {};
}

std::string write_all(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put > 0) {
      p += put;
      n -= static_cast<size_t>(put);
      continue;
    }
    if (put < 0 && errno == EINTR) continue;
    if (put < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno_text(errno);
    if (!wait_for(fd, POLLOUT, deadline)) return "timed out";
  }
  return {};
}

std::string peer_name(int fd) {
  struct sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<struct sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return std::string("[") + host + "]:" + std::to_string(port);
  }
  auto* a = reinterpret_cast<struct sockaddr_in*>(&ss);
  ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  port = ntohs(a->sin_port);
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace tcp
}  // namespace ringcomm
