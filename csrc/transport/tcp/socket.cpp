#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ringcomm/types.h"

namespace ringcomm {
namespace tcp {
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

Fd start_connect(const std::string& host, int port, std::string* error) {
  struct addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    *error = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    return Fd();
  }
  for (struct addrinfo* a = res; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd.valid()) {
      *error = errno_text(errno);
      continue;
    }
    set_nodelay(fd.get());
    int r;
    do {
      r = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    } while (r != 0 && errno == EINTR);
    if (r == 0 || errno == EINPROGRESS) {
      ::freeaddrinfo(res);
      return fd;
    }
    *error = errno_text(errno);
  }
  ::freeaddrinfo(res);
  return Fd();
}

int connect_error(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
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
