// TCP transport: links to ranks that share no memory with this one (other
// hosts), or to every rank when RINGCOMM_TRANSPORT=tcp.
//
// At most one connection per pair of ranks, made when a schedule first needs
// it: link(peer) hands out the link at once and, unless it is connected
// already, has the I/O thread dial the peer (who dials whom, and a dial
// crossed by the peer's own, are settled in connector.h; both ends present
// the communicator's secret first, see wire.h and handshake.h). A link that
// is not connected yet takes segments into its `out` ring like any other;
// they leave once it is. So a job of n ranks opens only the connections its
// schedules use (a ring's 2 per rank, recursive doubling's log2 n), not
// n(n-1)/2 of them. The links that are sure to be used (the ring
// neighbours, comm/communicator.cpp) are connected at init, all at once:
// the higher rank of each pair dials, the I/O thread makes every dial and
// accept in parallel, and init waits once for all of them.
//
// Every link owns two preallocated rings of nslots slots (slot_bytes plus a
// page of slack, so a payload may start at any page offset):
//   out  the executor writes a segment into a free slot and commits it; the
//        I/O thread sends committed slots (header + payload, many segments
//        per sendmsg) and frees each once it is fully in the kernel. A small
//        segment with nothing queued ahead of it is sent by the executor
//        itself at commit (no thread hand-off on the latency path).
//   in   the I/O thread reads a frame header, then the payload straight into
//        a free slot, and publishes it; the executor consumes it in place. An
//        executor that finds the ring empty reads a small frame that waits
//        whole in the kernel itself (a waiter that polls takes it without
//        the I/O thread waking first and then waking it).
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
// Large segments (more than kInlineBytes) of the caller's own memory leave
// by reference (Link::send_ref): the frame names the caller's bytes instead
// of a slot, and the I/O thread's sendmsg reads them there, so a large
// transfer is copied once on the sending side (into the kernel), as a plain
// socket's is. The executor counts such a send complete only once the I/O
// thread has moved past it (Link::sent); a call that fails first copies what
// is still queued into the slots (release_refs, under wmu_), so the I/O
// thread never reads memory that a returned call handed back.
//
// The receiving side's counterpart: a transfer's large segments that need
// no reduction (a plain receive, a point-to-point message) are posted
// (Link::post_recv) while nothing waits in the ring, and the I/O thread reads
// each frame that is the next posted segment straight into the caller's
// memory; the first frame that is not ends the post and goes to the ring as
// usual. An error cancels a post (release_refs, under rmu_): a frame being
// read into the caller's memory finishes in a slot.
//
// Failures: an ABORT frame from the peer, a connection that ends without the
// CLOSE frame (a dead process; an aborted rank keeps its connections open
// and says goodbye when it closes, so peer_gone() also names a rank whose
// stream ends after its ABORT without one), a reset, or a frame that fails the checks of
// wire.h mark the link failed with a reason that peer_abort_reason() reports
// (the executor polls it while it waits). A dial that fails (the peer's
// listener refuses: its process is gone; or no answer within the timeout)
// marks the link lost, which poll_peers() reports as PeerLostError naming
// the peer. announce_abort() sends ABORT to every connected peer (and to any
// that connects later), and resets connections that cannot take it within a
// second.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/tcp/connector.h"
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
  // Makes every rank p with a non-empty hosts[p] (listening at ports[p]) a
  // peer of this transport, starts the I/O thread, and connects the peers
  // in `now` (both ends of each such pair must name the other), in
  // parallel; returns once they are all up. `secret` (tcp::kSecretBytes
  // bytes) is shared by all ranks of the communicator. Throws TimeoutError
  // past `deadline` naming the ranks still missing, Error for a dial that
  // failed. A link set up later (link()) gives up `dial_timeout` after its
  // dial started.
  void connect(const std::vector<std::string>& hosts, const std::vector<int>& ports,
               const std::string& secret, const std::vector<int>& now, Clock::time_point deadline,
               Clock::duration dial_timeout);
  // Sends what is still queued, says goodbye to every peer and closes the
  // connections; waits for slow peers at most until `deadline`.
  void close(Clock::time_point deadline);
  // Whether `peer` is reached over TCP (connected or not yet).
  bool reaches(int peer) const;

  // The link to `peer`; the first call asks for its connection.
  Link* link(int peer) override;
  void poll_peers() override;
  void release_refs() override;
  std::string peer_gone(int peer) override;
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
  // Reads a small data frame waiting whole in the kernel into `l`'s next
  // slot from the executor's thread, if the I/O thread is not reading.
  bool recv_now(TcpLink& l);
  // Non-empty once this rank announced an abort.
  std::string local_abort() const;
  // This rank aborted or is closing (the I/O thread then discards what comes).
  bool winding_down() const {
    return aborted_.load(std::memory_order_relaxed) || stop_.load(std::memory_order_relaxed);
  }
  // Data frames received so far: read by the I/O thread, and by the
  // executor itself (recv_now).
  uint64_t frames_read_by_io() const { return frames_io_.load(std::memory_order_relaxed); }
  uint64_t frames_read_by_caller() const { return frames_caller_.load(std::memory_order_relaxed); }
  // Data frames sent from the caller's memory, and read straight into it.
  uint64_t frames_sent_by_ref() const { return frames_ref_.load(std::memory_order_relaxed); }
  uint64_t frames_landed() const { return frames_landed_.load(std::memory_order_relaxed); }
  void count_ref() { frames_ref_.fetch_add(1, std::memory_order_relaxed); }

 private:
  Link* open_link(int peer, bool dial);
  void await_links(const std::vector<int>& peers, Clock::time_point deadline);
  void serve_connector(Clock::time_point now);
  void attach(int peer, tcp::Fd fd);
  void lose(int peer, const std::string& why, bool timed_out);
  void io_loop();
  bool pump_out(TcpLink& l);
  bool pump_in(TcpLink& l);
  bool has_work();
  void fail_link(TcpLink& l, const std::string& why);
  void on_eof(TcpLink& l, int err);
  // A write or the socket's error broke the connection: reads what the peer
  // sent first (its ABORT frame, its goodbye), then on_eof (I/O thread, under the link's rmu_).
  void broken(TcpLink& l, int err);
  void shutdown_links();

  const int rank_;
  const int world_;
  const size_t slot_bytes_;
  const int nslots_;
  Transport* home_;
  tcp::Fd listener_;  // until connect() hands it to connector_
  tcp::Fd epoll_;
  tcp::Fd event_;  // eventfd: the executor wakes the I/O thread
  std::vector<std::string> hosts_;  // by rank: "" where another transport is used
  std::vector<int> ports_;
  Clock::duration dial_timeout_{};
  // Links by rank, made on first use (open_link) or when a peer connects
  // (attach); never replaced nor freed before the transport.
  std::unique_ptr<std::atomic<TcpLink*>[]> links_;
  std::vector<TcpLink*> live_;  // (io) the links with a socket, in the order they connected
  std::unique_ptr<tcp::Connector> connector_;  // (io) once connect() has started the I/O thread
  Clock::time_point last_connector_step_{};    // (io)
  std::mutex links_mu_;  // guards owned_, dial_requests_ and the making of links
  std::vector<std::unique_ptr<TcpLink>> owned_;
  std::vector<int> dial_requests_;       // peers whose link asks for a dial (the I/O thread starts it)
  std::atomic<bool> dial_asked_{false};  // dial_requests_ is not empty
  std::condition_variable links_cv_;     // a link came up or was lost (await_links)
  // What the listener turned away (a copy the I/O thread makes, guarded by links_mu_).
  uint64_t turned_away_ = 0;
  std::string turned_away_text_;
  std::thread io_;

  std::atomic<uint64_t> frames_io_{0};
  std::atomic<uint64_t> frames_caller_{0};
  std::atomic<uint64_t> frames_ref_{0};
  std::atomic<uint64_t> frames_landed_{0};
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
