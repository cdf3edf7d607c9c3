// TCP transport: links to ranks that share no memory with this one (other
// hosts), or to every rank when RINGCOMM_TRANSPORT=tcp.
//
// One connection per pair of ranks, made once per communicator (the higher
// rank dials the lower one; both present the communicator's secret first,
// see wire.h and handshake.h).
//
// Every link owns two preallocated rings of nslots slots (slot_bytes plus a
// page of slack, so a payload may start at any page offset):
//   out  the executor writes a segment into a free slot and commits it; the
//        I/O thread sends committed slots (header + payload, many segments
//        per sendmsg) and frees each once it is fully in the kernel. A small
//        segment with nothing queued ahead of it is sent by the executor
//        itself at commit (no thread hand-off on the latency path).
//   in   the I/O thread reads a frame header, then the payload straight into
//        a free slot, and publishes it; the executor consumes it in place.
// Counters only grow (one producer, one consumer: acquire / release), as in
// the shm FIFOs. A full `in` ring stops reading from that socket, so TCP's
// own flow control holds the sender back: nothing is allocated per message
// and messages of any size stream through.
//
// One I/O thread per transport waits in epoll on the sockets and on an
// eventfd that the executor signals after a commit or a release, but only
// while the I/O thread sleeps (a flag, as with the shm doorbell). When data
// arrives or a slot frees, the I/O thread calls home->wake(): the executor of
// this rank always sleeps on the shared-memory doorbell.
//
// Failures: an ABORT frame from the peer, a connection that ends without the
// CLOSE frame (a dead process), a reset, or a frame that fails the checks of
// wire.h mark the link failed with a reason that peer_abort_reason() reports
// (the executor polls it while it waits). announce_abort() sends ABORT to
// every peer, and resets connections that cannot take it within a second.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace ringcomm {

class TcpLink;

class TcpTransport : public Transport {
 public:
  // `home` is this rank's shared-memory transport, whose doorbell the
  // executor sleeps on; it must outlive this transport.
  TcpTransport(int rank, int world, size_t slot_bytes, int nslots, Transport* home);
  ~TcpTransport() override;

  // Listens on `host` (a numeric address of this machine; "" for every IPv4
  // interface) and returns the port. Call before the addresses are exchanged.
  int listen(const std::string& host);
  // Connects to every peer p with a non-empty hosts[p] (at ports[p]) and
  // starts the I/O thread. `secret` (tcp::kSecretBytes bytes) is shared by
  // all ranks of the communicator. Throws TimeoutError past `deadline`.
  void connect(const std::vector<std::string>& hosts, const std::vector<int>& ports,
               const std::string& secret, Clock::time_point deadline);
  // Sends what is still queued, says goodbye to every peer and closes the
  // connections; waits for slow peers at most until `deadline`.
  void close(Clock::time_point deadline);
  bool reaches(int peer) const;

  Link* link(int peer) override;
  void sleep(Clock::time_point until, const std::function<bool()>& recheck) override {
    home_->sleep(until, recheck);
  }
  void wake() override { home_->wake(); }
  void announce_abort(const std::string& why) override;
  std::string peer_abort_reason(int peer) override;
  // This rank's last calls (answered to STATUS QUERY frames by the I/O
  // thread), and a peer's, asked for by request_peer_calls and waited for
  // (at most kStatusWait from the request) by peer_call.
  void record_call(const CallRecordView& call) override;
  void request_peer_calls() override;
  bool peer_call(int peer, bool p2p, CallRecordView* out) override;

  // Called by the links after a commit or a release: wakes the I/O thread
  // if it sleeps.
  void notify_io();
  // Sends frame `i` of `l` from the executor's thread if the socket is free.
  bool send_now(TcpLink& l, uint64_t i);
  // Non-empty once this rank announced an abort.
  std::string local_abort() const;

 private:
  void io_loop();
  bool pump_out(TcpLink& l);
  bool pump_in(TcpLink& l);
  bool has_work();
  void fail_link(TcpLink& l, const std::string& why);
  void on_eof(TcpLink& l, int err);
  void shutdown_links();

  const int rank_;
  const int world_;
  const size_t slot_bytes_;
  const int nslots_;
  Transport* home_;
  tcp::Fd listener_;
  tcp::Fd epoll_;
  tcp::Fd event_;  // eventfd: the executor wakes the I/O thread
  std::vector<std::unique_ptr<TcpLink>> links_;  // by rank; null where another transport is used
  std::thread io_;

  std::atomic<uint32_t> io_sleeping_{0};
  std::atomic<bool> stop_{false};     // close(): drain, say goodbye, exit
  std::atomic<bool> aborted_{false};  // announce_abort() was called
  Clock::time_point close_deadline_;
  mutable std::mutex mu_;
  std::string abort_reason_;  // guarded by mu_
  CallRecordView my_calls_[2];  // guarded by mu_: [0] collective, [1] point-to-point
  Clock::time_point status_deadline_{};
};

}  // namespace ringcomm
