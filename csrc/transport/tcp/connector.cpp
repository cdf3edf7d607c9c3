#include "transport/tcp/connector.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ringcomm/types.h"

namespace ringcomm {
namespace tcp {
namespace {

// epoll keys: a dial is keyed by its peer's rank, the listener and the
// accepted connections by a tag in the top bits.
constexpr uint64_t kListenKey = 1ULL << 62;
constexpr uint64_t kPendingKey = 2ULL << 62;
constexpr uint64_t kTagMask = 3ULL << 62;

// This rank's greeting to `to`: 72 bytes into a fresh socket's send buffer
// (16 KiB and more), so one non-blocking send takes them, or the connection
// is not worth waiting for. "" when sent, else what went wrong.
std::string send_greeting(int fd, const Identity& me, int to) {
  char greeting[kGreetingBytes];
  encode_greeting(me, to, greeting);
  ssize_t put;
  do {
    put = ::send(fd, greeting, sizeof greeting, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (put < 0 && errno == EINTR);
  if (put == static_cast<ssize_t>(sizeof greeting)) return "";
  return put < 0 ? errno_text(errno) : std::string("the socket took only part");
}

}  // namespace

Connector::Connector(const Identity& me, Fd listener, std::vector<std::string> hosts, std::vector<int> ports)
    : me_(me),
      listener_(std::move(listener)),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      hosts_(std::move(hosts)),
      ports_(std::move(ports)),
      connected_(me.world, 0) {
  if (!epoll_.valid()) throw Error("ringcomm: epoll_create1: " + errno_text(errno));
  for (int p = 0; p < me_.world; ++p) tcp_peers_ += p != me_.rank && !hosts_[p].empty();
  pending_.reserve(kMaxPending + 1);
  if (listener_.valid()) watch(listener_.get(), EPOLLIN, kListenKey);
}

Connector::~Connector() = default;

void Connector::watch(int fd, uint32_t events, uint64_t key) {
  struct epoll_event ev{};
  ev.events = events;
  ev.data.u64 = key;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0 &&
      (errno != EEXIST || ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0)) {
    throw Error("ringcomm: epoll_ctl: " + errno_text(errno));
  }
}

std::string Connector::where(int peer) const {
  return "rank " + std::to_string(me_.rank) + " connecting over TCP to rank " + std::to_string(peer) + " at " +
         hosts_[peer] + ":" + std::to_string(ports_[peer]);
}

Connector::Dial* Connector::dial_of(int peer) {
  for (Dial& d : dials_) {
    if (d.peer == peer) return &d;
  }
  return nullptr;
}

void Connector::finish_dial(int peer) {
  for (size_t i = 0; i < dials_.size(); ++i) {
    if (dials_[i].peer != peer) continue;
    if (dials_[i].fd.valid()) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, dials_[i].fd.get(), nullptr);
    dials_.erase(dials_.begin() + static_cast<long>(i));
    return;
  }
}

void Connector::dial(int peer, Clock::time_point deadline) {
  if (peer < 0 || peer >= me_.world || peer == me_.rank || hosts_[peer].empty()) {
    throw Error("ringcomm: rank " + std::to_string(me_.rank) + " has no TCP address for rank " +
                std::to_string(peer));
  }
  if (connected_[peer] || dial_of(peer)) return;
  dials_.push_back(Dial{peer, deadline, GreetingReader(me_, peer)});
  start_attempt(dials_.back());
}

void Connector::start_attempt(Dial& d) {
  d.reader = GreetingReader(me_, d.peer);
  d.stage = Dial::kConnecting;
  d.fd = start_connect(hosts_[d.peer], ports_[d.peer], &d.start_error);
  if (d.fd.valid()) watch(d.fd.get(), EPOLLOUT, static_cast<uint64_t>(d.peer));
  // Otherwise the next step() reports start_error.
}

void Connector::fail_dial(Dial& d, const std::string& what, std::vector<Result>* out) {
  Result r;
  r.peer = d.peer;
  r.timed_out = Clock::now() >= d.deadline;
  r.error = where(d.peer) + ": " + what;
  out->push_back(std::move(r));
  finish_dial(d.peer);
}

void Connector::joined(int peer, Fd fd, std::vector<Result>* out) {
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd.get(), nullptr);
  connected_[peer] = 1;
  ++connected_count_;
  Result r;
  r.peer = peer;
  r.fd = std::move(fd);
  out->push_back(std::move(r));
  if (connected_count_ == tcp_peers_ && listener_.valid()) {
    // Every peer is connected: nobody else may connect.
    listener_.reset();
    pending_.clear();
  }
}

void Connector::serve_dial(Dial& d, Clock::time_point now, std::vector<Result>* out) {
  if (d.stage == Dial::kConnecting) {
    const int err = connect_error(d.fd.get());
    if (err == ECONNREFUSED) {
      // Every rank listens before its address is published and keeps
      // listening until all its TCP peers are connected.
      return fail_dial(d, std::string(errno_text(err)) + ": nothing listens there any more (did the process of rank " +
                              std::to_string(d.peer) + " die or close its communicator?)",
                       out);
    }
    if (err != 0) return fail_dial(d, errno_text(err), out);
    const std::string sent = send_greeting(d.fd.get(), me_, d.peer);
    if (!sent.empty()) return fail_dial(d, "sending the handshake: " + sent, out);
    d.stage = Dial::kAnswer;
    watch(d.fd.get(), EPOLLIN, static_cast<uint64_t>(d.peer));
  }
  char in[kGreetingBytes];
  while (d.reader.status() == GreetingReader::kMore) {
    ssize_t got = ::recv(d.fd.get(), in, d.reader.want(), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got > 0) {
      d.reader.feed(in, static_cast<size_t>(got));
      continue;
    }
    const std::string err = got == 0 ? kClosedByPeer : errno_text(errno);
    // Closed before a byte of the answer: the peer is dialling this rank
    // itself (and is the lower rank: its connection is kept, see the top of
    // connector.h), or a listener swamped by strangers dropped this one.
    const bool dropped = d.reader.received() == 0 && (got == 0 || errno == ECONNRESET);
    if (dropped && d.attempt < kDialAttempts && now + d.backoff < d.deadline) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, d.fd.get(), nullptr);
      d.fd.reset();
      d.stage = Dial::kBackoff;
      d.retry_at = now + d.backoff;
      d.backoff *= 2;
      return;
    }
    if (d.reader.received() >= kSecretBytes) return fail_dial(d, "reading its handshake: " + err, out);
    return fail_dial(d, "waiting for its handshake: " + err +
                            (d.attempt > 1 ? " (" + std::to_string(d.attempt) + " attempts)" : std::string()) +
                            " (a listener that turns the secret away closes the connection: do both ranks "
                            "belong to the same job and communicator?)",
                     out);
  }
  if (d.reader.status() == GreetingReader::kBadSecret) {
    return fail_dial(d, "it answered with a different secret (another job's socket?); connection closed", out);
  }
  if (d.reader.status() == GreetingReader::kBadHello) return fail_dial(d, "bad handshake: " + d.reader.error(), out);
  const int peer = d.peer;
  Fd fd = std::move(d.fd);
  finish_dial(peer);
  joined(peer, std::move(fd), out);
}

void Connector::drop(size_t i, uint64_t& counter, const std::string& why) {
  ++counter;
  turned_away_ = "a connection from " + pending_[i].name + " was closed: " + why;
  pending_.erase(pending_.begin() + static_cast<long>(i));
}

// Reads what pending_[i] has sent so far, without blocking; acts on its
// greeting once that is complete. Returns false when pending_[i] is gone
// (joined or dropped).
bool Connector::serve(size_t i, std::vector<Result>* out) {
  Pending& p = pending_[i];
  char buf[kGreetingBytes];
  for (;;) {
    // The secret is read on its own, and checked before anything else is read.
    ssize_t got = ::recv(p.fd.get(), buf, p.reader.want(), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (got <= 0) {
      drop(i, stats_.hung_up, got == 0 ? "it closed before completing the handshake" : errno_text(errno));
      return false;
    }
    const GreetingReader::Status s = p.reader.feed(buf, static_cast<size_t>(got));
    if (s == GreetingReader::kMore) continue;
    if (s == GreetingReader::kBadSecret) {
      drop(i, stats_.bad_secret, p.reader.error());
      return false;
    }
    std::string why = p.reader.error();
    const Hello& h = p.reader.hello();
    const std::string from = "rank " + std::to_string(h.from);
    if (why.empty() && hosts_[h.from].empty()) {
      why = from + " is not expected to connect to rank " + std::to_string(me_.rank) + " (they share memory)";
    }
    if (why.empty() && connected_[h.from]) why = from + " is already connected";
    if (why.empty() && dial_of(h.from)) {
      if (me_.rank < h.from) {
        // Both dialled: this rank's own dial is the one kept. Closing
        // without an answer makes the peer's dial wait for this one.
        ++stats_.superseded;
        pending_.erase(pending_.begin() + static_cast<long>(i));
        return false;
      }
      finish_dial(h.from);  // the lower rank's dial is kept: answer it
    }
    if (why.empty()) {
      const std::string sent = send_greeting(p.fd.get(), me_, h.from);
      if (!sent.empty()) why = "answering it: " + sent;
    }
    if (!why.empty()) {
      drop(i, stats_.bad_hello, "bad handshake: " + why);
      return false;
    }
    const int peer = h.from;
    Fd fd = std::move(p.fd);
    pending_.erase(pending_.begin() + static_cast<long>(i));
    joined(peer, std::move(fd), out);
    return false;
  }
}

void Connector::step(Clock::time_point now, std::vector<Result>* out) {
  // Dials that could not even start, and timers.
  for (size_t i = dials_.size(); i-- > 0;) {
    Dial& d = dials_[i];
    if (d.stage == Dial::kConnecting && !d.fd.valid()) {
      fail_dial(d, d.start_error, out);
      continue;
    }
    if (now >= d.deadline) {
      fail_dial(d, d.stage == Dial::kConnecting ? "connection attempt timed out" : "timed out waiting for its handshake",
                out);
      continue;
    }
    if (d.stage == Dial::kBackoff && now >= d.retry_at) {
      ++d.attempt;
      start_attempt(d);
    }
  }
  while (!pending_.empty() && now - pending_.front().since >= kHandshakeGrace) {
    drop(0, stats_.timed_out, "no complete handshake within " + handshake_grace_text() + " s");
  }
  struct epoll_event evs[64];
  const int n = ::epoll_wait(epoll_.get(), evs, 64, 0);
  bool accept_now = false;
  for (int k = 0; k < n; ++k) {
    const uint64_t key = evs[k].data.u64;
    if (key == kListenKey) {
      accept_now = true;
    } else if ((key & kTagMask) == kPendingKey) {
      const uint64_t id = key & ~kTagMask;
      for (size_t i = 0; i < pending_.size(); ++i) {
        if (pending_[i].id == id) {
          serve(i, out);
          break;
        }
      }
    } else if (Dial* d = dial_of(static_cast<int>(key))) {
      if (d->fd.valid()) serve_dial(*d, now, out);
    }
  }
  if (!accept_now || !listener_.valid()) return;
  for (int k = 0; k < kAcceptBurst && listener_.valid(); ++k) {
    Fd fd = accept_from(listener_.get());
    if (!fd.valid()) break;
    ++stats_.accepted;
    std::string name = peer_name(fd.get());
    const uint64_t id = next_id_++ & ~kTagMask;
    watch(fd.get(), EPOLLIN, kPendingKey | id);
    pending_.push_back(Pending{id, std::move(fd), std::move(name), Clock::now(), GreetingReader(me_, -1)});
    // A real peer's greeting is usually in already: read it at once.
    if (!serve(pending_.size() - 1, out) || pending_.size() <= kMaxPending) continue;
    // Too many waiting: drop the oldest that has not shown the secret (or,
    // should all of them have, the oldest).
    size_t victim = 0;
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (!pending_[i].reader.authenticated()) {
        victim = i;
        break;
      }
    }
    drop(victim, stats_.evicted, "more than " + std::to_string(kMaxPending) + " connections were waiting");
  }
}

Clock::time_point Connector::next_timer() const {
  Clock::time_point t = Clock::time_point::max();
  if (!pending_.empty()) t = pending_.front().since + kHandshakeGrace;
  for (const Dial& d : dials_) {
    t = std::min(t, d.deadline);
    if (d.stage == Dial::kBackoff) t = std::min(t, d.retry_at);
  }
  return t;
}

}  // namespace tcp
}  // namespace ringcomm
