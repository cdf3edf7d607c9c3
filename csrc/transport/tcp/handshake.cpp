#include "transport/tcp/handshake.h"

#include "ringcomm/interrupt.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ringcomm/types.h"
#include "transport/tcp/wire.h"

namespace ringcomm {
namespace tcp {
namespace {

std::string seconds_text(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", std::chrono::duration<double>(d).count());
  return buf;
}

const std::string kGraceText = seconds_text(kHandshakeGrace);

}  // namespace

void encode_greeting(const Identity& me, int to, char out[kGreetingBytes]) {
  Hello h;
  h.frame_bytes = sizeof(FrameHeader);
  h.from = me.rank;
  h.to = to;
  h.world = me.world;
  h.nslots = static_cast<uint32_t>(me.nslots);
  h.slot_bytes = me.slot_bytes;
  std::memset(out, 0, kSecretBytes);
  std::memcpy(out, me.secret.data(), std::min(me.secret.size(), kSecretBytes));
  std::memcpy(out + kSecretBytes, &h, sizeof h);
}

size_t GreetingReader::want() const {
  if (status_ != kMore) return 0;
  return got_ < kSecretBytes ? kSecretBytes - got_ : kGreetingBytes - got_;
}

GreetingReader::Status GreetingReader::feed(const void* data, size_t n, size_t* used) {
  const char* in = static_cast<const char*>(data);
  size_t taken = 0;
  while (status_ == kMore && taken < n) {
    const size_t take = std::min(n - taken, want());
    std::memcpy(buf_ + got_, in + taken, take);
    got_ += take;
    taken += take;
    if (got_ == kSecretBytes) {
      // The secret, checked before a byte of the Hello is looked at.
      if (me_->secret.size() != kSecretBytes || !same_secret(buf_, me_->secret.data())) {
        status_ = kBadSecret;
        error_ = "it did not present this communicator's secret";
      }
    } else if (got_ == kGreetingBytes) {
      std::memcpy(&hello_, buf_ + kSecretBytes, sizeof hello_);
      error_ = check_hello(hello_, me_->rank, me_->world, expect_from_, me_->slot_bytes, me_->nslots);
      status_ = error_.empty() ? kDone : kBadHello;
    }
  }
  if (used) *used = taken;
  return status_;
}

std::string AcceptStats::summary() const {
  std::string s;
  auto add = [&](uint64_t n, const std::string& what) {
    if (n) s += (s.empty() ? "" : ", ") + std::to_string(n) + " " + what;
  };
  add(bad_secret, "without the secret");
  add(bad_hello, "with a bad handshake");
  add(timed_out, "without a complete handshake within " + kGraceText + " s");
  add(evicted, "dropped to keep at most " + std::to_string(kMaxPending) + " waiting");
  add(hung_up, "closed before completing the handshake");
  return s;
}

Fd dial(const Identity& me, int peer, const std::string& host, int port, Clock::time_point deadline) {
  const std::string where = "rank " + std::to_string(me.rank) + " connecting over TCP to rank " +
                            std::to_string(peer) + " at " + host + ":" + std::to_string(port);
  auto fail = [&](const std::string& what) -> Error {
    if (Clock::now() >= deadline) return TimeoutError("ringcomm: " + where + ": " + what);
    return Error("ringcomm: " + where + ": " + what);
  };
  auto backoff = std::chrono::milliseconds(50);
  for (int attempt = 1;; ++attempt) {
    std::string err;
    Fd fd = connect_to(host, port, deadline, &err);
    if (!fd.valid()) throw fail(err);
    char out[kGreetingBytes];
    encode_greeting(me, peer, out);
    err = write_all(fd.get(), out, sizeof out, deadline);
    if (!err.empty()) throw fail("sending the handshake: " + err);
    GreetingReader reader(me, peer);
    char in[kGreetingBytes];
    while (reader.status() == GreetingReader::kMore) {
      const size_t want = reader.want();
      err = read_exact(fd.get(), in, want, deadline);
      if (!err.empty()) break;
      reader.feed(in, want);
    }
    if (!err.empty()) {
      // Closed before a byte of the answer: a listener swamped by strangers
      // may have dropped this connection (handshake.h); connect again.
      const bool dropped = reader.received() == 0 && (err == kClosedByPeer || err == errno_text(ECONNRESET));
      if (dropped && attempt < kDialAttempts && Clock::now() + backoff < deadline) {
        std::this_thread::sleep_for(backoff);
        backoff *= 2;
        continue;
      }
      if (reader.received() >= kSecretBytes) throw fail("reading its handshake: " + err);
      throw fail("waiting for its handshake: " + err +
                 (attempt > 1 ? " (" + std::to_string(attempt) + " attempts)" : std::string()) +
                 " (a listener that turns the secret away closes the connection: do both ranks "
                 "belong to the same job and communicator?)");
    }
    if (reader.status() == GreetingReader::kBadSecret) {
      throw fail("it answered with a different secret (another job's socket?); connection closed");
    }
    if (reader.status() == GreetingReader::kBadHello) throw fail("bad handshake: " + reader.error());
    return fd;
  }
}

std::vector<Fd> accept_peers(int listener, const Identity& me, const std::vector<bool>& expected,
                             Clock::time_point deadline, AcceptStats* stats) {
  struct Pending {
    Fd fd;
    std::string name;
    Clock::time_point since;
    GreetingReader reader;
  };
  AcceptStats own;
  AcceptStats& st = stats ? *stats : own;
  std::vector<Fd> peers(me.world);
  int missing = static_cast<int>(std::count(expected.begin(), expected.end(), true));
  std::vector<Pending> pending;
  pending.reserve(kMaxPending + 1);
  std::string turned_away;  // the last connection closed, for the timeout message
  auto drop = [&](size_t i, uint64_t& counter, const std::string& why) {
    ++counter;
    turned_away = "a connection from " + pending[i].name + " was closed: " + why;
    pending.erase(pending.begin() + static_cast<long>(i));
  };
  // Reads what pending[i] has sent so far, without blocking; acts on its
  // greeting once that is complete. Returns false when pending[i] is gone
  // (joined or dropped).
  auto serve = [&](size_t i) -> bool {
    Pending& p = pending[i];
    char buf[kGreetingBytes];
    for (;;) {
      // The secret is read on its own, and checked before anything else is read.
      ssize_t got = ::recv(p.fd.get(), buf, p.reader.want(), 0);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (got <= 0) {
        drop(i, st.hung_up, got == 0 ? "it closed before completing the handshake" : errno_text(errno));
        return false;
      }
      const GreetingReader::Status s = p.reader.feed(buf, static_cast<size_t>(got));
      if (s == GreetingReader::kMore) continue;
      if (s == GreetingReader::kBadSecret) {
        drop(i, st.bad_secret, p.reader.error());
        return false;
      }
      std::string why = p.reader.error();
      const Hello& h = p.reader.hello();
      const std::string from = "rank " + std::to_string(h.from);
      if (why.empty() && !expected[h.from]) {
        why = from + " is not expected to connect to rank " + std::to_string(me.rank);
      }
      if (why.empty() && peers[h.from].valid()) why = from + " is already connected";
      if (why.empty()) {
        // 72 bytes into a fresh socket's send buffer (16 KiB and more): one
        // non-blocking send takes them, or the connection is not worth waiting for.
        char out[kGreetingBytes];
        encode_greeting(me, h.from, out);
        ssize_t put;
        do {
          put = ::send(p.fd.get(), out, sizeof out, MSG_NOSIGNAL | MSG_DONTWAIT);
        } while (put < 0 && errno == EINTR);
        if (put != static_cast<ssize_t>(sizeof out)) {
          why = "answering it: " + (put < 0 ? errno_text(errno) : std::string("the socket took only part"));
        }
      }
      if (!why.empty()) {
        drop(i, st.bad_hello, "bad handshake: " + why);
        return false;
      }
      peers[h.from] = std::move(p.fd);
      --missing;
      pending.erase(pending.begin() + static_cast<long>(i));
      return false;
    }
  };
  const Clock::time_point start = Clock::now();
  Clock::time_point last_interrupt_check{};
  std::vector<struct pollfd> fds;
  while (missing > 0) {
    const Clock::time_point now = Clock::now();
    check_interrupted(now, &last_interrupt_check, [] { return "waiting for TCP connections"; });
    if (now >= deadline) {
      std::string who;
      for (int p = 0; p < me.world; ++p) {
        if (expected[p] && !peers[p].valid()) who += (who.empty() ? "" : ", ") + std::to_string(p);
      }
      std::string strangers;
      if (st.turned_away()) {
        strangers = "; " + std::to_string(st.turned_away()) + " connection(s) turned away (" + st.summary() +
                    "), the last: " + turned_away;
      }
      throw TimeoutError("ringcomm: rank " + std::to_string(me.rank) + " timed out after " +
                         seconds_text(now - start) + " s waiting for TCP connections from rank(s) " + who +
                         strangers);
    }
    // pending is in accept order: the oldest first.
    while (!pending.empty() && now - pending.front().since >= kHandshakeGrace) {
      drop(0, st.timed_out, "no complete handshake within " + kGraceText + " s");
    }
    fds.clear();
    fds.push_back({listener, POLLIN, 0});
    for (Pending& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    Clock::time_point wake = std::min(deadline, now + kInterruptPoll);
    if (!pending.empty()) wake = std::min(wake, pending.front().since + kHandshakeGrace);
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
    int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(wait, 0)));
    if (r <= 0) continue;
    // Greetings first (fds[i + 1] belongs to pending[i]); going from the back
    // keeps the indices of those not served yet.
    for (size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 1].revents) serve(i);
    }
    if (missing == 0 || !(fds[0].revents & POLLIN)) continue;
    for (int k = 0; k < kAcceptBurst && missing > 0; ++k) {
      Fd fd = accept_from(listener);
      if (!fd.valid()) break;
      ++st.accepted;
      std::string name = peer_name(fd.get());
      pending.push_back(Pending{std::move(fd), std::move(name), Clock::now(), GreetingReader(me, -1)});
      // A real peer's greeting is usually in already: read it at once.
      if (!serve(pending.size() - 1) || pending.size() <= kMaxPending) continue;
      // Too many waiting: drop the oldest that has not shown the secret (or,
      // should all of them have, the oldest).
      size_t victim = 0;
      for (size_t i = 0; i < pending.size(); ++i) {
        if (!pending[i].reader.authenticated()) {
          victim = i;
          break;
        }
      }
      drop(victim, st.evicted, "more than " + std::to_string(kMaxPending) + " connections were waiting");
    }
  }
  return peers;
}

}  // namespace tcp
}  // namespace ringcomm
