#include "transport/tcp/handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ringcomm/types.h"
#include "transport/tcp/wire.h"

namespace ringcomm {
namespace tcp {
namespace {

constexpr size_t kGreeting = kSecretBytes + sizeof(Hello);
// A connection that has not finished its greeting by then is dropped (the
// real peers send theirs at once; this bounds what a stray client costs).
constexpr auto kGreetingGrace = std::chrono::seconds(10);
constexpr size_t kMaxPending = 64;

void greeting(const Identity& me, int to, char* out) {
  Hello h;
  h.frame_bytes = sizeof(FrameHeader);
  h.from = me.rank;
  h.to = to;
  h.world = me.world;
  h.nslots = static_cast<uint32_t>(me.nslots);
  h.slot_bytes = me.slot_bytes;
  std::memcpy(out, me.secret.data(), kSecretBytes);
  std::memcpy(out + kSecretBytes, &h, sizeof h);
}

std::string seconds_text(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace

Fd dial(const Identity& me, int peer, const std::string& host, int port, Clock::time_point deadline) {
  const std::string where = "rank " + std::to_string(me.rank) + " connecting over TCP to rank " +
                            std::to_string(peer) + " at " + host + ":" + std::to_string(port);
  auto fail = [&](const std::string& what) -> Error {
    if (Clock::now() >= deadline) return TimeoutError("ringcomm: " + where + ": " + what);
    return Error("ringcomm: " + where + ": " + what);
  };
  std::string err;
  Fd fd = connect_to(host, port, deadline, &err);
  if (!fd.valid()) throw fail(err);
  char out[kGreeting];
  greeting(me, peer, out);
  err = write_all(fd.get(), out, sizeof out, deadline);
  if (!err.empty()) throw fail("sending the handshake: " + err);
  char in[kGreeting];
  err = read_exact(fd.get(), in, kSecretBytes, deadline);
  if (!err.empty()) {
    throw fail("waiting for its handshake: " + err +
               " (a listener that turns the secret away closes the connection: do both ranks "
               "belong to the same job and communicator?)");
  }
  if (!same_secret(in, me.secret.data())) {
    throw fail("it answered with a different secret (another job's socket?); connection closed");
  }
  err = read_exact(fd.get(), in + kSecretBytes, sizeof(Hello), deadline);
  if (!err.empty()) throw fail("reading its handshake: " + err);
  Hello h;
  std::memcpy(&h, in + kSecretBytes, sizeof h);
  err = check_hello(h, me.rank, me.world, peer, me.slot_bytes, me.nslots);
  if (!err.empty()) throw fail("bad handshake: " + err);
  return fd;
}

std::vector<Fd> accept_peers(int listener, const Identity& me, const std::vector<bool>& expected,
                             Clock::time_point deadline) {
  struct Pending {
    Fd fd;
    std::string name;
    Clock::time_point since;
    size_t got = 0;
    char buf[kGreeting];
  };
  std::vector<Fd> peers(me.world);
  int missing = static_cast<int>(std::count(expected.begin(), expected.end(), true));
  std::vector<Pending> pending;
  std::string turned_away;  // the last connection closed, for the timeout message
  auto reject = [&](size_t i, const std::string& why) {
    turned_away = "a connection from " + pending[i].name + " was closed: " + why;
    pending.erase(pending.begin() + static_cast<long>(i));
  };
  const Clock::time_point start = Clock::now();
  std::vector<struct pollfd> fds;
  while (missing > 0) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      std::string who;
      for (int p = 0; p < me.world; ++p) {
        if (expected[p] && !peers[p].valid()) who += (who.empty() ? "" : ", ") + std::to_string(p);
      }
      throw TimeoutError("ringcomm: rank " + std::to_string(me.rank) + " timed out after " +
                         seconds_text(now - start) + " s waiting for TCP connections from rank(s) " + who +
                         (turned_away.empty() ? "" : "; " + turned_away));
    }
    for (size_t i = 0; i < pending.size();) {
      if (now - pending[i].since > kGreetingGrace) {
        reject(i, "no complete handshake within 10 s");
      } else {
        ++i;
      }
    }
    fds.clear();
    fds.push_back({listener, POLLIN, 0});
    for (Pending& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(wait, 200)));
    if (r <= 0) continue;
    // Greetings first (fds[i + 1] belongs to pending[i]); erasing from the back keeps indices.
    for (size_t i = pending.size(); i-- > 0;) {
      if (!fds[i + 1].revents) continue;
      Pending& p = pending[i];
      // The secret is read on its own, and checked before anything else is read.
      size_t want = p.got < kSecretBytes ? kSecretBytes - p.got : kGreeting - p.got;
      ssize_t got = ::recv(p.fd.get(), p.buf + p.got, want, 0);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        reject(i, got == 0 ? "it closed before completing the handshake" : errno_text(errno));
        continue;
      }
      if (got < 0) continue;
      p.got += static_cast<size_t>(got);
      if (p.got == kSecretBytes && !same_secret(p.buf, me.secret.data())) {
        reject(i, "it did not present this communicator's secret");
        continue;
      }
      if (p.got < kGreeting) continue;
      Hello h;
      std::memcpy(&h, p.buf + kSecretBytes, sizeof h);
      std::string why = check_hello(h, me.rank, me.world, -1, me.slot_bytes, me.nslots);
      const std::string from = "rank " + std::to_string(h.from);
      if (why.empty() && !expected[h.from]) {
        why = from + " is not expected to connect to rank " + std::to_string(me.rank);
      }
      if (why.empty() && peers[h.from].valid()) why = from + " is already connected";
      if (why.empty()) {
        char out[kGreeting];
        greeting(me, h.from, out);
        why = write_all(p.fd.get(), out, sizeof out, std::min(deadline, Clock::now() + kGreetingGrace));
      }
      if (!why.empty()) {
        reject(i, "bad handshake: " + why);
        continue;
      }
      peers[h.from] = std::move(p.fd);
      --missing;
      pending.erase(pending.begin() + static_cast<long>(i));
    }
    if (fds[0].revents & POLLIN) {
      for (;;) {
        Fd fd = accept_from(listener);
        if (!fd.valid()) break;
        if (pending.size() >= kMaxPending) continue;  // closed at once: too many strays
        std::string name = peer_name(fd.get());
        pending.push_back(Pending{std::move(fd), std::move(name), Clock::now(), 0, {}});
      }
    }
  }
  return peers;
}

}  // namespace tcp
}  // namespace ringcomm
