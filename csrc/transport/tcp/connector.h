// Connection set-up for the TCP transport, without blocking: the dials this
// rank makes (connect, greeting, the peer's answer) and the connections its
// listener accepts (strangers included), all moved on by step() from the I/O
// thread's loop (tcp_transport.h), which sleeps on fd() among its sockets.
//
// Who dials whom. A link is set up when one of its ends first needs it:
// that end dials (TcpTransport::link). The other end accepts at any time,
// whether or not its own schedule has reached the link yet, so a link costs
// one round trip to whichever rank wants it first and nothing to a pair of
// ranks whose schedules never meet. Both ends may want it at the same
// moment and dial each other; exactly one connection survives: the one the
// lower rank dialled. The lower rank refuses the higher one's greeting while
// its own dial is under way (it closes without answering, which the higher
// rank's dial treats as "try again shortly", kDialAttempts), and the higher
// rank, receiving the lower one's greeting while its own dial is under way,
// drops its dial and answers. Both decisions are made by the one thread
// that owns this object, so no third case exists: a greeting from a peer is
// either seen before this rank starts its own dial (and answered; the dial
// is then never started) or after (and decided as above).
//
// Strangers at the listener cost what handshake.h says (kHandshakeGrace per
// connection, at most kMaxPending waiting, the oldest unauthenticated one
// evicted); the listener closes once every TCP peer is connected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ringcomm {
namespace tcp {

class Connector {
 public:
  // What step() reports: a link that is up (fd valid), or a dial that failed
  // (error says where and why, without the "ringcomm: " prefix; timed_out
  // when it ran past its deadline).
  struct Result {
    int peer = -1;
    Fd fd;
    std::string error;
    bool timed_out = false;
  };

  // `hosts[p]` / `ports[p]`: where rank p listens ("" for a rank reached by
  // another transport: it may neither be dialled nor connect here).
  Connector(const Identity& me, Fd listener, std::vector<std::string> hosts, std::vector<int> ports);
  ~Connector();

  // An epoll descriptor that is readable while step() has sockets to serve.
  int fd() const { return epoll_.get(); }
  // Starts a dial to `peer` (one of the TCP peers, not yet connected nor
  // being dialled); it fails past `deadline`.
  void dial(int peer, Clock::time_point deadline);
  // Serves every socket that is ready and every timer that is due, without
  // blocking; appends what became of the links to *out.
  void step(Clock::time_point now, std::vector<Result>* out);
  // When step() must run next even if fd() stays quiet (max() when never).
  Clock::time_point next_timer() const;

  const AcceptStats& stats() const { return stats_; }
  bool listening() const { return listener_.valid(); }
  const std::string& last_turned_away() const { return turned_away_; }
  int connected() const { return connected_count_; }

 private:
  struct Pending {
    uint64_t id;
    Fd fd;
    std::string name;
    Clock::time_point since;
    GreetingReader reader;
  };
  struct Dial {
    Dial(int p, Clock::time_point d, GreetingReader r) : peer(p), deadline(d), reader(r) {}
    int peer;
    Clock::time_point deadline;
    GreetingReader reader;
    Fd fd;  // invalid while in back-off, or when the attempt could not start (start_error)
    enum Stage { kConnecting, kAnswer, kBackoff } stage = kConnecting;
    std::string start_error;
    int attempt = 1;
    Clock::time_point retry_at;
    std::chrono::milliseconds backoff{50};
  };

  void watch(int fd, uint32_t events, uint64_t key);
  bool serve(size_t i, std::vector<Result>* out);
  void drop(size_t i, uint64_t& counter, const std::string& why);
  void start_attempt(Dial& d);
  void serve_dial(Dial& d, Clock::time_point now, std::vector<Result>* out);
  void fail_dial(Dial& d, const std::string& what, std::vector<Result>* out);
  Dial* dial_of(int peer);
  void finish_dial(int peer);
  void joined(int peer, Fd fd, std::vector<Result>* out);
  std::string where(int peer) const;

  const Identity me_;
  Fd listener_;
  Fd epoll_;
  const std::vector<std::string> hosts_;
  const std::vector<int> ports_;
  int tcp_peers_ = 0;
  int connected_count_ = 0;
  std::vector<char> connected_;  // by rank
  std::vector<Pending> pending_;  // accepted, greeting not complete yet: the oldest first
  uint64_t next_id_ = 0;
  std::vector<Dial> dials_;
  AcceptStats stats_;
  std::string turned_away_;  // the last connection turned away, for a timeout message
};

}  // namespace tcp
}  // namespace ringcomm
