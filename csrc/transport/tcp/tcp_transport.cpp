#include "transport/tcp/tcp_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ringcomm/interrupt.h"
#include "ringcomm/text.h"
#include "ringcomm/types.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/wire.h"

namespace ringcomm {

using tcp::FrameHeader;

namespace {

constexpr size_t kPageBytes = 4096;
constexpr int kMaxIov = 64;
constexpr uint64_t kEventKey = ~0ULL;
constexpr uint64_t kConnectorKey = ~1ULL;
// How often the I/O thread looks at the listener and the handshakes under
// way while its links keep it busy (it always does when it would sleep).
constexpr auto kConnectorPoll = std::chrono::milliseconds(1);
// How long an ABORT frame may wait for room in the socket before the
// connection is reset instead (a reset reaches the peer even when it reads
// nothing).
constexpr auto kAbortGrace = std::chrono::seconds(1);
// Segments up to this size are written by the executor at commit time when
// nothing is queued ahead of them: small messages do not wait for the I/O
// thread to wake up, and a completed call has its small messages in the
// kernel already (they survive the process). Larger ones stream from the
// I/O thread, in parallel with the executor filling the next slot.
constexpr uint32_t kInlineBytes = 64 * 1024;

}  // namespace

// One peer: the rings, the socket, and the I/O thread's progress on both.
// Members marked (io) belong to the I/O thread; the atomics are shared with
// the executor, which only calls the Link methods.
class TcpLink : public Link {
 public:
  // kLost: no connection could be made (reason_ says why; poll_peers).
  enum State : int { kOpen = 0, kPeerClosed = 1, kFailed = 2, kLost = 3 };

  // Not connected yet: the I/O thread gives it a socket (attach) or loses it.
  TcpLink(TcpTransport* owner, int rank, int peer, size_t slot_bytes, int nslots)
      : owner_(owner),
        rank_(rank),
        peer_(peer),
        slot_bytes_(slot_bytes),
        n_(static_cast<uint64_t>(nslots)),
        stride_(tcp::slot_stride(slot_bytes)),
        out_hdr_(nslots),
        out_ref_(nslots, nullptr),
        in_hdr_(nslots) {
    mem_bytes_ = 2 * n_ * stride_;
    void* p = ::mmap(nullptr, mem_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw Error("ringcomm: cannot allocate " + std::to_string(mem_bytes_) +
                  " bytes of TCP slots for rank " + std::to_string(peer) + ": " + tcp::errno_text(errno));
    }
    mem_ = static_cast<char*>(p);
  }
  ~TcpLink() override {
    if (mem_) ::munmap(mem_, mem_bytes_);
  }

  size_t slot_bytes() const override { return slot_bytes_; }

  char* send_slot(uint32_t page_offset, size_t /*nbytes*/) override {
    if (!out_room()) return nullptr;
    send_offset_ = page_offset % kPageBytes;
    return out_data(out_tail_.load(std::memory_order_relaxed)) + send_offset_;
  }

  void send_commit(const MsgHeader& header) override {
    const uint64_t tail = out_tail_.load(std::memory_order_relaxed);
    FrameHeader& f = out_hdr_[tail % n_];
    f = tcp::data_frame(header, send_offset_);
    out_ref_[tail % n_] = nullptr;
    out_tail_.store(tail + 1, std::memory_order_release);
    if (f.nbytes <= kInlineBytes && owner_->send_now(*this, tail)) return;
    owner_->notify_io();
  }

  // Large segments leave from the caller's memory: the I/O thread's sendmsg
  // reads them there, which saves the copy into a slot.
  size_t ref_min_bytes() const override { return kInlineBytes + 1; }

  uint64_t send_ref(const char* src, const MsgHeader& header) override {
    const uint64_t tail = out_tail_.load(std::memory_order_relaxed);
    out_hdr_[tail % n_] = tcp::data_frame(header, page_offset(src));
    out_ref_[tail % n_] = src;
    out_tail_.store(tail + 1, std::memory_order_release);
    owner_->count_ref();
    owner_->notify_io();
    return tail + 1;
  }

  bool sent(uint64_t ticket) override { return out_head_.load(std::memory_order_acquire) >= ticket; }

  // (executor) Copies the payloads still queued by reference into their
  // slots (Transport::release_refs). Under wmu_: the I/O thread is not in a
  // sendmsg that reads them.
  void detach_refs() {
    std::lock_guard<std::mutex> lk(wmu_);
    const uint64_t tail = out_tail_.load(std::memory_order_relaxed);
    for (uint64_t i = out_head_.load(std::memory_order_relaxed); i < tail; ++i) {
      const char*& ref = out_ref_[i % n_];
      if (!ref) continue;
      const FrameHeader& f = out_hdr_[i % n_];
      std::memcpy(out_data(i) + f.payload_offset, ref, f.nbytes);
      ref = nullptr;
    }
  }

  // Large data frames land in the caller's memory (post_recv): the I/O
  // thread's recv writes them there, which saves the copy out of a slot.
  size_t post_min_bytes() const override { return kInlineBytes + 1; }

  bool post_recv(char* dst, size_t nbytes, const MsgTag& tag, uint64_t segment, size_t seg_bytes) override {
    if (post_active_ || nbytes == 0 || in_tail_.load(std::memory_order_acquire) != in_head_.load(std::memory_order_relaxed)) {
      return false;
    }
    std::lock_guard<std::mutex> lk(rmu_);
    // Only at a frame boundary with nothing in the ring: the next frame the
    // I/O thread reads is the first that may be the posted one.
    if (!fd_.valid() || eof_ || rstate_ != kHeader || rgot_ != 0 || state_.load(std::memory_order_relaxed) != kOpen ||
        owner_->winding_down() || in_tail_.load(std::memory_order_relaxed) != in_head_.load(std::memory_order_relaxed)) {
      return false;
    }
    posted_ = true;
    post_dst_ = dst;
    post_left_ = nbytes;
    post_seg_ = segment;
    post_seg_bytes_ = seg_bytes;
    post_tag_ = tag;
    post_landed_.store(0, std::memory_order_relaxed);
    post_over_.store(false, std::memory_order_relaxed);
    post_active_ = true;
    return true;
  }

  size_t posted(bool* over) override {
    bool ended = post_over_.load(std::memory_order_acquire);
    if (!ended && state_.load(std::memory_order_acquire) != kOpen) {
      cancel_post();  // what comes now (if anything) is for recv_peek, which reports the link's state
      ended = true;
    }
    const size_t landed = post_landed_.load(std::memory_order_acquire);
    if (ended) post_active_ = false;
    *over = ended;
    return landed;
  }

  // (executor) Ends a post: a frame being read into the caller's memory
  // finishes in a slot instead (Transport::release_refs after an error).
  void cancel_post() {
    std::lock_guard<std::mutex> lk(rmu_);
    if (posted_ && rdirect_) {
      const uint64_t slot = in_tail_.load(std::memory_order_relaxed);  // free: the ring was empty
      in_hdr_[slot % n_] = tcp::data_header(rhdr_);
      rdst_ = in_data(slot) + rhdr_.payload_offset + (rhdr_.nbytes - rleft_);
      rdirect_ = false;
    }
    posted_ = false;
    post_over_.store(true, std::memory_order_release);
    post_active_ = false;
  }

  // (io, under wmu_) Where frame i's payload lies: its slot, or the caller's memory.
  const char* out_payload(uint64_t i) const {
    const char* ref = out_ref_[i % n_];
    return ref ? ref : out_data(i) + out_hdr_[i % n_].payload_offset;
  }

  const MsgHeader* recv_peek(const char** payload) override {
    if (post_active_) return nullptr;  // the posted segments come first (posted())
    const uint64_t head = in_head_.load(std::memory_order_relaxed);
    if (in_tail_.load(std::memory_order_acquire) == head && !owner_->recv_now(*this)) {
      check_local_abort();
      // Frames before the goodbye are published before the state changes:
      // look at the ring again once the state says "closed".
      if (state_.load(std::memory_order_acquire) == kPeerClosed &&
          in_tail_.load(std::memory_order_acquire) == head) {
        throw Error("ringcomm: rank " + std::to_string(peer_) + " closed its communicator while rank " +
                    std::to_string(rank_) +
                    " still expects data from it (did the ranks issue different calls?)");
      }
      return nullptr;
    }
    const MsgHeader* h = &in_hdr_[head % n_];
    *payload = in_data(head) + h->payload_offset;
    return h;
  }

  void recv_release() override {
    in_head_.store(in_head_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    owner_->notify_io();  // the I/O thread may be waiting for room in a full ring
  }

  // Whether the executor may queue a segment now (throws when the peer closed).
  bool out_room() {
    check_local_abort();
    const int st = state_.load(std::memory_order_acquire);
    if (st == kPeerClosed) {
      throw Error("ringcomm: rank " + std::to_string(peer_) + " closed its communicator; rank " +
                  std::to_string(rank_) + " cannot send to it (did the ranks issue different calls?)");
    }
    if (st == kFailed || st == kLost) return false;  // the executor reports peer_abort_reason() / poll_peers()
    return out_tail_.load(std::memory_order_relaxed) - out_head_.load(std::memory_order_acquire) < n_;
  }

  std::string failure() const {
    return state_.load(std::memory_order_acquire) == kFailed ? reason_ : std::string();
  }

  void check_local_abort() const {
    std::string why = owner_->local_abort();
    if (why.empty()) return;
    if (mentions_revoke(why)) throw RevokedError("ringcomm: " + why);
    throw Error("ringcomm: rank " + std::to_string(rank_) + " aborted: " + why);
  }

  // (io) the `in` ring has a free slot; the `out` ring holds unsent frames.
  bool in_has_room() const {
    return in_tail_.load(std::memory_order_relaxed) - in_head_.load(std::memory_order_acquire) < n_;
  }
  bool out_pending() const {
    return out_tail_.load(std::memory_order_acquire) != out_head_.load(std::memory_order_relaxed);
  }

  char* out_data(uint64_t i) const { return mem_ + (i % n_) * stride_; }
  char* in_data(uint64_t i) const { return mem_ + (n_ + i % n_) * stride_; }

  TcpTransport* const owner_;
  const int rank_;
  const int peer_;
  tcp::Fd fd_;  // set by the I/O thread (attach, under wmu_)
  std::string name_ = "not connected";  // (io) the peer's address
  std::atomic<bool> connected_{false};  // fd_ was set (it may have been closed since)
  bool lost_timeout_ = false;  // kLost because the dial ran out of time
  const size_t slot_bytes_;
  const uint64_t n_;
  const size_t stride_;
  char* mem_ = nullptr;  // out slots, then in slots
  size_t mem_bytes_ = 0;
  std::vector<FrameHeader> out_hdr_;
  // Per out slot: the caller's memory a frame is sent from (send_ref), or
  // null (the payload is in the slot). Written by the executor before it
  // publishes the frame; cleared by it under wmu_ (detach_refs).
  std::vector<const char*> out_ref_;
  std::vector<MsgHeader> in_hdr_;

  alignas(64) std::atomic<uint64_t> out_tail_{0};  // committed by the executor
  alignas(64) std::atomic<uint64_t> out_head_{0};  // sent by the I/O thread
  alignas(64) std::atomic<uint64_t> in_tail_{0};   // received by the I/O thread
  alignas(64) std::atomic<uint64_t> in_head_{0};   // released by the executor
  // (executor) recv_now found a frame it leaves to the I/O thread (a large,
  // control or partly arrived frame) at the head of the stream while in_tail_
  // was this: it does not look again (syscalls under rmu_ each time) until the
  // I/O thread has published.
  uint64_t recv_now_skip_ = ~uint64_t{0};
  std::atomic<int> state_{kOpen};
  std::string reason_;  // written once by the I/O thread, before state_ becomes kFailed or kLost
  // The peer's end of the connection is gone (its stream ended, or it was
  // reset, without an ABORT frame first, or after one but without the goodbye
  // an aborted rank sends when it closes): set by the I/O thread also after
  // this rank aborted (peer_gone: agreement needs to know who died after
  // the communicator failed). gone_why_ is written once, before gone_.
  std::atomic<bool> gone_{false};
  std::string gone_why_;

  uint32_t send_offset_ = 0;  // executor: page offset of the slot being filled

  // Sending. wmu_ guards the writes to the socket and what says how far they
  // got (woff_, ctrl_, coff_, out_head_ updates, closing fd_): the I/O thread
  // holds it while it sends, the executor tries it to send a small segment
  // at once (TcpTransport::send_now).
  std::mutex wmu_;
  size_t woff_ = 0;             // bytes of frame out_head_ already sent
  std::string ctrl_;            // ABORT / CLOSE frame to send at the next frame boundary
  size_t coff_ = 0;
  std::string status_out_;      // STATUS frames to send at the next frame boundary (not final)
  size_t soff_ = 0;
  // The peer's last STATUS REPORT (guarded by status_mu_), counted by status_seen_.
  std::mutex status_mu_;
  CallRecordView peer_calls_[2];
  std::atomic<uint64_t> status_seen_{0};
  uint64_t status_asked_ = 0;   // status_seen_ when the last query was sent (requesting thread)
  bool status_requested_ = false;  // the last request_peer_calls asked this peer (requesting thread)
  std::atomic<bool> done_writing_{false};  // goodbye or abort sent (write side shut), or failed
  bool out_ready_ = true;       // (io) the socket took everything so far (edge-triggered epoll)
  bool abort_queued_ = false;   // (io)
  // (io) The ABORT frame is out. The connection stays open (no FIN) until this
  // rank closes, which says goodbye (CLOSE) after it: so the peer can tell an
  // aborted rank that lives (no EOF, or EOF after a goodbye) from one that died.
  bool abort_sent_ = false;
  bool close_queued_ = false;   // (io)
  bool peer_aborted_ = false;   // (io) the peer's ABORT frame came
  bool peer_goodbye_ = false;   // (io) the peer's CLOSE frame came
  Clock::time_point abort_deadline_;  // (io)
  // Receiving. rmu_ guards the read side of the socket and the state below
  // (rstate_ .. rreason_, eof_, and closing fd_ besides wmu_): the I/O thread
  // holds it while it reads, the executor tries it to read a small frame
  // that is waiting whole in the kernel (TcpTransport::recv_now).
  std::mutex rmu_;
  bool in_ready_ = true;  // (io)
  bool eof_ = false;
  int broke_err_ = 0;  // (io) a write's or the socket's error, for broken() under rmu_
  enum { kHeader, kPayload, kReason, kSkip } rstate_ = kHeader;
  char rbytes_[sizeof(FrameHeader)];  // the header being read, as it came
  FrameHeader rhdr_;                  // ... and decoded (tcp::decode_frame)
  size_t rgot_ = 0;
  char* rdst_ = nullptr;
  size_t rleft_ = 0;
  std::string rreason_;
  // A post (post_recv), guarded by rmu_: the I/O thread reads matching data
  // frames to post_dst_ (rdirect_: the frame being read goes there) and
  // counts what landed; post_over_ once it has ended.
  bool posted_ = false;
  bool rdirect_ = false;
  char* post_dst_ = nullptr;
  size_t post_left_ = 0;
  uint64_t post_seg_ = 0;
  size_t post_seg_bytes_ = 0;
  MsgTag post_tag_;
  std::atomic<size_t> post_landed_{0};
  std::atomic<bool> post_over_{true};
  bool post_active_ = false;  // (executor) a post that posted() has not seen end
};

TcpTransport::TcpTransport(int rank, int world, size_t slot_bytes, int nslots, Transport* home)
    : rank_(rank),
      world_(world),
      slot_bytes_(slot_bytes),
      nslots_(nslots),
      home_(home),
      links_(new std::atomic<TcpLink*>[world]) {
  for (int p = 0; p < world; ++p) links_[p].store(nullptr, std::memory_order_relaxed);
}

TcpTransport::~TcpTransport() {
  try {
    close(Clock::now());
  } catch (...) {
  }
}

int TcpTransport::listen(const std::string& host) {
  int port = 0;
  listener_ = tcp::listen_on(host, &port);
  return port;
}

bool TcpTransport::reaches(int peer) const {
  return peer >= 0 && peer < static_cast<int>(hosts_.size()) && !hosts_[peer].empty();
}

void TcpTransport::connect(const std::vector<std::string>& hosts, const std::vector<int>& ports,
                           const std::string& secret, const std::vector<int>& now, Clock::time_point deadline,
                           Clock::duration dial_timeout) {
  if (static_cast<int>(hosts.size()) != world_ || static_cast<int>(ports.size()) != world_) {
    throw ValueError("ringcomm: connect_tcp: expected " + std::to_string(world_) + " hosts and ports");
  }
  if (secret.size() != tcp::kSecretBytes) {
    throw ValueError("ringcomm: connect_tcp: the secret must be " + std::to_string(tcp::kSecretBytes) +
                     " bytes, got " + std::to_string(secret.size()));
  }
  if (io_.joinable()) throw Error("ringcomm: the TCP transport is already connected");
  if (!listener_.valid()) throw Error("ringcomm: connect_tcp before listen_tcp");
  hosts_ = hosts;
  hosts_[rank_].clear();
  ports_ = ports;
  dial_timeout_ = dial_timeout;
  for (int p : now) {
    if (!reaches(p)) throw ValueError("ringcomm: connect_tcp: rank " + std::to_string(p) + " is no TCP peer");
  }
  epoll_ = tcp::Fd(::epoll_create1(EPOLL_CLOEXEC));
  event_ = tcp::Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_.valid() || !event_.valid()) throw Error("ringcomm: epoll / eventfd: " + tcp::errno_text(errno));
  connector_ = std::make_unique<tcp::Connector>(tcp::Identity{rank_, world_, slot_bytes_, nslots_, secret},
                                                std::move(listener_), hosts_, ports_);
  struct epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kEventKey;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, event_.get(), &ev);
  ev.data.u64 = kConnectorKey;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, connector_->fd(), &ev);
  // The links wanted up front: both ends know them, so one dial per pair
  // (the higher rank's, as the lower one would keep its own in a crossing)
  // and the lower rank just waits for it.
  for (int p : now) open_link(p, p < rank_);
  io_ = std::thread([this] { io_loop(); });
  await_links(now, deadline);
  std::lock_guard<std::mutex> lk(links_mu_);
  if (turned_away_) {
    // Someone other than the job's ranks connected to this rank's port:
    // worth one line (docs/security.md).
    std::fprintf(stderr, "ringcomm: rank %d turned away %llu TCP connection(s) while waiting for its peers (%s)\n",
                 rank_, static_cast<unsigned long long>(turned_away_), turned_away_text_.c_str());
  }
}

Link* TcpTransport::link(int peer) {
  TcpLink* l = links_[peer].load(std::memory_order_acquire);
  return l ? l : open_link(peer, true);
}

Link* TcpTransport::open_link(int peer, bool dial) {
  if (!reaches(peer)) {
    throw Error("ringcomm: rank " + std::to_string(rank_) + " has no TCP address for rank " + std::to_string(peer));
  }
  std::lock_guard<std::mutex> lk(links_mu_);
  TcpLink* l = links_[peer].load(std::memory_order_relaxed);
  if (l) return l;
  owned_.push_back(std::make_unique<TcpLink>(this, rank_, peer, slot_bytes_, nslots_));
  l = owned_.back().get();
  links_[peer].store(l, std::memory_order_release);
  if (dial) {
    dial_requests_.push_back(peer);
    dial_asked_.store(true, std::memory_order_release);
    uint64_t one = 1;
    ssize_t r = ::write(event_.get(), &one, sizeof one);
    (void)r;
  }
  return l;
}

// init's one wait for the links it connects up front (their dials and
// accepts all run at once in the I/O thread).
void TcpTransport::await_links(const std::vector<int>& peers, Clock::time_point deadline) {
  const Clock::time_point start = Clock::now();
  Clock::time_point last_interrupt_check{};
  std::unique_lock<std::mutex> lk(links_mu_);
  for (;;) {
    std::string missing;
    for (int p : peers) {
      TcpLink* l = links_[p].load(std::memory_order_acquire);
      if (l->state_.load(std::memory_order_acquire) == TcpLink::kLost) {
        if (l->lost_timeout_) throw TimeoutError("ringcomm: " + l->reason_);
        throw Error("ringcomm: " + l->reason_);
      }
      if (!l->connected_.load(std::memory_order_acquire)) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    }
    if (missing.empty()) return;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      char took[32];
      std::snprintf(took, sizeof took, "%.3g", std::chrono::duration<double>(now - start).count());
      std::string strangers;
      if (turned_away_) {
        strangers = "; " + std::to_string(turned_away_) + " connection(s) turned away (" + turned_away_text_ + ")";
      }
      throw TimeoutError("ringcomm: rank " + std::to_string(rank_) + ": Timed out after " + took +
                         " s waiting for TCP connections with rank(s) " + missing + strangers);
    }
    links_cv_.wait_for(lk, std::min<Clock::duration>(kInterruptPoll, deadline - now));
    lk.unlock();
    check_interrupted(Clock::now(), &last_interrupt_check, [] { return "waiting for TCP connections"; });
    lk.lock();
  }
}

// (io) Starts the dials that links asked for, serves the listener and the
// handshakes under way, and takes in the links they produced.
void TcpTransport::serve_connector(Clock::time_point now) {
  last_connector_step_ = now;
  if (dial_asked_.exchange(false, std::memory_order_acq_rel)) {
    std::vector<int> asked;
    {
      std::lock_guard<std::mutex> lk(links_mu_);
      asked.swap(dial_requests_);
    }
    for (int p : asked) connector_->dial(p, now + dial_timeout_);
  }
  std::vector<tcp::Connector::Result> done;
  connector_->step(now, &done);
  for (tcp::Connector::Result& r : done) {
    if (r.fd.valid()) {
      attach(r.peer, std::move(r.fd));
    } else {
      lose(r.peer, r.error, r.timed_out);
    }
  }
  const tcp::AcceptStats& st = connector_->stats();
  if (st.turned_away() != turned_away_) {
    std::lock_guard<std::mutex> lk(links_mu_);
    turned_away_ = st.turned_away();
    turned_away_text_ = st.summary() + "; the last: " + connector_->last_turned_away();
  }
}

// (io) `fd` is the connection to `peer`, through its handshake.
void TcpTransport::attach(int peer, tcp::Fd fd) {
  TcpLink* l = static_cast<TcpLink*>(open_link(peer, false));
  {
    std::lock_guard<std::mutex> wlk(l->wmu_);
    std::lock_guard<std::mutex> rlk(l->rmu_);
    l->name_ = tcp::peer_name(fd.get());
    l->fd_ = std::move(fd);
    l->out_ready_ = l->in_ready_ = true;
  }
  struct epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = static_cast<uint64_t>(peer);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, l->fd_.get(), &ev) != 0) {
    std::lock_guard<std::mutex> wlk(l->wmu_);
    std::lock_guard<std::mutex> rlk(l->rmu_);
    l->fd_.reset();
    lose(peer, "epoll_ctl for the connection to rank " + std::to_string(peer) + ": " + tcp::errno_text(errno), false);
    return;
  }
  live_.push_back(l);
  {
    std::lock_guard<std::mutex> lk(links_mu_);
    l->connected_.store(true, std::memory_order_release);
  }
  links_cv_.notify_all();
  home_->wake();  // the executor may wait for data that was queued for it
}

// (io) No connection to `peer` could be made.
void TcpTransport::lose(int peer, const std::string& why, bool timed_out) {
  TcpLink* l = static_cast<TcpLink*>(open_link(peer, false));
  {
    std::lock_guard<std::mutex> lk(links_mu_);
    l->reason_ = why;
    l->lost_timeout_ = timed_out;
    l->state_.store(TcpLink::kLost, std::memory_order_release);
  }
  links_cv_.notify_all();
  home_->wake();
}

void TcpTransport::release_refs() {
  std::vector<TcpLink*> links;
  {
    std::lock_guard<std::mutex> lk(links_mu_);
    for (auto& l : owned_) links.push_back(l.get());
  }
  for (TcpLink* l : links) {  // each takes one of the link's locks at a time
    l->detach_refs();
    if (l->post_active_) l->cancel_post();
  }
}

void TcpTransport::poll_peers() {
  for (int p = 0; p < world_; ++p) {
    TcpLink* l = links_[p].load(std::memory_order_acquire);
    if (l && l->state_.load(std::memory_order_acquire) == TcpLink::kLost) throw PeerLostError(l->reason_);
  }
}

std::string TcpTransport::peer_gone(int peer) {
  if (peer < 0 || peer >= world_) return {};
  TcpLink* l = links_[peer].load(std::memory_order_acquire);
  if (!l) return {};
  if (l->gone_.load(std::memory_order_acquire)) return l->gone_why_;
  const int state = l->state_.load(std::memory_order_acquire);
  // reason_ is written once, before state_ turns kLost. (kFailed is no
  // evidence: a peer that aborted, and is alive, fails its links too.)
  if (state == TcpLink::kLost) return l->reason_;
  if (state == TcpLink::kPeerClosed) return "rank " + std::to_string(peer) + " closed its communicator";
  return {};
}

void TcpTransport::notify_io() {
  // Pairs with the fence in io_loop: either the I/O thread sees the new
  // counters in has_work(), or we see its sleeping flag here.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (io_sleeping_.load(std::memory_order_relaxed) && event_.valid()) {
    uint64_t one = 1;
    ssize_t r = ::write(event_.get(), &one, sizeof one);
    (void)r;
  }
}

std::string TcpTransport::local_abort() const {
  if (!aborted_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> lk(mu_);
  return abort_reason_;
}

void TcpTransport::announce_abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.load()) return;
    abort_reason_ = why.empty() ? "aborted" : why;
    aborted_.store(true, std::memory_order_release);
  }
  if (event_.valid()) {
    uint64_t one = 1;
    ssize_t r = ::write(event_.get(), &one, sizeof one);
    (void)r;
  }
}

void TcpTransport::record_call(const CallRecordView& call) {
  std::lock_guard<std::mutex> lk(mu_);
  my_calls_[call.p2p ? 1 : 0] = call;
}

namespace {
constexpr auto kStatusWait = std::chrono::milliseconds(300);
}  // namespace

void TcpTransport::request_peer_calls() {
  bool any = false;
  std::lock_guard<std::mutex> lk(links_mu_);
  for (auto& lp : owned_) {
    TcpLink& l = *lp;
    l.status_requested_ = false;
    if (!l.connected_.load(std::memory_order_acquire) || l.done_writing_ ||
        aborted_.load(std::memory_order_acquire)) {
      continue;  // after an ABORT frame only the goodbye goes out
    }
    l.status_asked_ = l.status_seen_.load(std::memory_order_acquire);
    std::lock_guard<std::mutex> wlk(l.wmu_);
    if (!l.fd_.valid()) continue;
    if (l.status_out_.size() < 64 * sizeof(FrameHeader)) l.status_out_ += tcp::status_query();
    l.status_requested_ = any = true;
  }
  status_deadline_ = Clock::now() + kStatusWait;
  if (any) notify_io();
}

bool TcpTransport::peer_call(int peer, bool p2p, CallRecordView* out) {
  if (!reaches(peer) || status_deadline_ == Clock::time_point{}) return false;
  TcpLink* lp = links_[peer].load(std::memory_order_acquire);
  if (!lp || !lp->status_requested_) return false;  // never connected: nothing to ask
  TcpLink& l = *lp;
  while (l.status_seen_.load(std::memory_order_acquire) == l.status_asked_) {
    if (Clock::now() >= status_deadline_ || l.state_.load(std::memory_order_acquire) == TcpLink::kFailed) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> lk(l.status_mu_);
  *out = l.peer_calls_[p2p ? 1 : 0];
  return true;
}

std::string TcpTransport::peer_abort_reason(int peer) {
  if (!reaches(peer)) return {};
  TcpLink* l = links_[peer].load(std::memory_order_acquire);
  return l ? l->failure() : std::string();
}

void TcpTransport::fail_link(TcpLink& l, const std::string& why) {
  if (l.state_.load(std::memory_order_relaxed) != TcpLink::kFailed) {
    l.reason_ = why;
    l.state_.store(TcpLink::kFailed, std::memory_order_release);
  }
  l.done_writing_ = true;
  home_->wake();
}

// The stream from `l` ended (err == 0: orderly, otherwise errno).
void TcpTransport::on_eof(TcpLink& l, int err) {
  l.eof_ = true;
  l.in_ready_ = false;
  // Evidence of a death unless this rank hung up on the peer (a bad frame) or
  // the peer, having aborted, said goodbye first (an aborted rank keeps its
  // connections open until it closes its communicator, and closes with a
  // goodbye: an EOF after its ABORT frame without one is its process ending).
  const int was = l.state_.load(std::memory_order_relaxed);
  const bool died_after_abort = was == TcpLink::kFailed && l.peer_aborted_ && !l.peer_goodbye_;
  if (!l.gone_.load(std::memory_order_relaxed) &&
      (was == TcpLink::kOpen || was == TcpLink::kPeerClosed || died_after_abort)) {
    l.gone_why_ = "rank " + std::to_string(l.peer_) + " (" + l.name_ + "): its TCP connection " +
                  (err != 0 ? "failed: " + tcp::errno_text(err) : std::string("was closed")) +
                  (was == TcpLink::kPeerClosed ? " (it closed its communicator)"
                   : died_after_abort          ? " after it aborted, without a goodbye (did its process die?)"
                                               : " (did its process die?)");
    l.gone_.store(true, std::memory_order_release);
  }
  if (stop_.load(std::memory_order_relaxed) || aborted_.load(std::memory_order_relaxed)) return;
  if (l.state_.load(std::memory_order_relaxed) != TcpLink::kOpen) return;  // after its goodbye or abort
  const std::string who = "rank " + std::to_string(l.peer_) + " (" + l.name_ + ")";
  if (err != 0) {
    fail_link(l, "its TCP connection to rank " + std::to_string(rank_) + " failed: " + tcp::errno_text(err) +
                     " (did the process of " + who + " die?)");
  } else if (l.rstate_ != TcpLink::kHeader || l.rgot_ != 0) {
    fail_link(l, "the TCP stream from " + who + " ended in the middle of a frame (truncated)");
  } else {
    fail_link(l, "its TCP connection to rank " + std::to_string(rank_) +
                     " closed without a goodbye (did the process of " + who + " die?)");
  }
}

// The connection to `l`'s peer broke (errno `err`, seen writing or as the
// socket's error). What the peer sent before it went (its ABORT frame with
// the reason, its goodbye) explains the break better than the errno: a rank
// that aborts and closes at once leaves both in this socket's receive queue,
// which the I/O thread may not have read yet on a busy host. So that is read
// first (as far as the ring has room), then the break is reported; on_eof
// keeps a failure the frames already gave. I/O thread, holding l.rmu_ (not
// wmu_: reading may answer a status query).
void TcpTransport::broken(TcpLink& l, int err) {
  if (!l.eof_) {
    l.in_ready_ = true;
    pump_in(l);
  }
  on_eof(l, err);
}

// The executor's fast path: frame `i`, just committed, goes to the socket
// now if nothing is queued ahead of it and the I/O thread is not sending.
// Returns whether it was sent whole; otherwise the I/O thread sends the rest
// (it also reports any error).
bool TcpTransport::send_now(TcpLink& l, uint64_t i) {
  std::unique_lock<std::mutex> lk(l.wmu_, std::try_to_lock);
  if (!lk.owns_lock() || l.done_writing_.load(std::memory_order_relaxed) || !l.fd_.valid() ||
      aborted_.load(std::memory_order_relaxed) || l.woff_ != 0 || l.soff_ != 0 || l.coff_ < l.ctrl_.size() ||
      l.out_head_.load(std::memory_order_relaxed) != i) {
    return false;
  }
  FrameHeader& f = l.out_hdr_[i % l.n_];
  struct iovec iov[2] = {{&f, sizeof f}, {const_cast<char*>(l.out_payload(i)), f.nbytes}};
  struct msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = f.nbytes ? 2 : 1;
  ssize_t put = ::sendmsg(l.fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (put <= 0) return false;
  if (static_cast<size_t>(put) < sizeof f + f.nbytes) {
    l.woff_ = static_cast<size_t>(put);
    return false;
  }
  l.out_head_.store(i + 1, std::memory_order_release);
  return true;
}

// The executor's fast path on the receiving side: with its `in` ring empty,
// a data frame of at most kInlineBytes that waits whole in the kernel is read
// into the next slot and published here, on the executor's thread, so a
// waiting executor that polls (spins or yields) takes a small message without
// the I/O thread waking up first and then waking it. Anything else (a frame
// under way, control frames, large or partial frames, a link that is not open,
// the I/O thread reading) is left to the I/O thread. Returns whether a frame
// was published.
bool TcpTransport::recv_now(TcpLink& l) {
  if (l.in_tail_.load(std::memory_order_relaxed) == l.recv_now_skip_) return false;
  std::unique_lock<std::mutex> lk(l.rmu_, std::try_to_lock);
  if (!lk.owns_lock() || !l.fd_.valid() || l.eof_ || l.posted_ || l.rstate_ != TcpLink::kHeader || l.rgot_ != 0 ||
      l.state_.load(std::memory_order_relaxed) != TcpLink::kOpen || stop_.load(std::memory_order_relaxed) ||
      aborted_.load(std::memory_order_relaxed) || !l.in_has_room()) {
    return false;
  }
  const int fd = l.fd_.get();
  ssize_t got = ::recv(fd, l.rbytes_, sizeof(FrameHeader), MSG_PEEK | MSG_DONTWAIT);
  if (got != static_cast<ssize_t>(sizeof(FrameHeader))) return false;
  FrameHeader f;
  if (!tcp::decode_frame(l.rbytes_, sizeof l.rbytes_, slot_bytes_, &f).empty() || f.type != tcp::kData ||
      f.nbytes > kInlineBytes) {
    l.recv_now_skip_ = l.in_tail_.load(std::memory_order_relaxed);
    return false;  // the I/O thread reads it (and reports a bad one)
  }
  int queued = 0;
  if (::ioctl(fd, FIONREAD, &queued) != 0 || static_cast<size_t>(queued) < sizeof f + f.nbytes) {
    // Under way: the I/O thread, woken by the bytes still coming, reads it.
    // Looking again while they come only holds rmu_ against it.
    l.recv_now_skip_ = l.in_tail_.load(std::memory_order_relaxed);
    return false;
  }
  const uint64_t slot = l.in_tail_.load(std::memory_order_relaxed);
  char* dst = l.in_data(slot) + f.payload_offset;
  struct iovec iov[2] = {{l.rbytes_, sizeof f}, {dst, f.nbytes}};
  do {
    got = ::readv(fd, iov, f.nbytes ? 2 : 1);
  } while (got < 0 && errno == EINTR);
  if (got <= 0) return false;  // the I/O thread sees the error or EOF too
  // The bytes are ours now: the frame goes on as pump_in would carry it.
  const size_t n = static_cast<size_t>(got);
  if (n >= sizeof f) l.in_hdr_[slot % l.n_] = tcp::data_header(f);
  if (n == sizeof f + f.nbytes) {
    l.in_tail_.store(slot + 1, std::memory_order_release);
    frames_caller_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // FIONREAD promised the whole frame, so a short read is not expected; if it
  // comes, the I/O thread reads the rest (the bytes' arrival set its
  // in_ready_, or will) from the state pump_in would have left.
  if (n < sizeof f) {
    l.rgot_ = n;
  } else {
    l.rhdr_ = f;
    l.rdst_ = dst + (n - sizeof f);
    l.rleft_ = sizeof f + f.nbytes - n;
    l.rstate_ = TcpLink::kPayload;
  }
  lk.unlock();
  notify_io();
  return false;
}

// Sends queued frames until the socket is full (the caller holds l.wmu_).
// Returns whether bytes moved.
bool TcpTransport::pump_out(TcpLink& l) {
  if (!l.fd_.valid() || l.done_writing_ || !l.out_ready_) return false;
  const bool aborting = aborted_.load(std::memory_order_relaxed);
  bool moved = false;
  for (int round = 0; round < 8 && !l.done_writing_; ++round) {
    struct iovec iov[kMaxIov];
    int n = 0;
    // STATUS frames go between frames (they are not final), and nothing else
    // starts before a partly sent one is out.
    const bool status = l.woff_ == 0 && l.coff_ == 0 && l.soff_ < l.status_out_.size();
    const bool ctrl = !status && l.woff_ == 0 && l.coff_ < l.ctrl_.size();
    const uint64_t head = l.out_head_.load(std::memory_order_relaxed);
    if (status) {
      iov[n++] = {&l.status_out_[l.soff_], l.status_out_.size() - l.soff_};
    } else if (ctrl) {
      iov[n++] = {&l.ctrl_[l.coff_], l.ctrl_.size() - l.coff_};
    } else {
      // After an abort only a partly sent frame is finished (the peer's
      // parser must reach the ABORT frame); everything else is dropped.
      const uint64_t tail =
          aborting ? (l.woff_ ? head + 1 : head) : l.out_tail_.load(std::memory_order_acquire);
      size_t skip = l.woff_;
      for (uint64_t i = head; i < tail && n + 2 <= kMaxIov; ++i) {
        FrameHeader& f = l.out_hdr_[i % l.n_];
        if (skip < sizeof f) {
          iov[n++] = {reinterpret_cast<char*>(&f) + skip, sizeof f - skip};
          skip = 0;
        } else {
          skip -= sizeof f;
        }
        if (f.nbytes > skip) iov[n++] = {const_cast<char*>(l.out_payload(i)) + skip, f.nbytes - skip};
        skip = 0;
      }
    }
    if (n == 0) break;
    struct msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t put = ::sendmsg(l.fd_.get(), &msg, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        l.out_ready_ = false;
      } else {
        l.broke_err_ = errno;  // reported after the read side's look (broken(), under rmu_)
        l.done_writing_ = true;
      }
      break;
    }
    moved = true;
    if (status) {
      l.soff_ += static_cast<size_t>(put);
      if (l.soff_ == l.status_out_.size()) {
        l.status_out_.clear();
        l.soff_ = 0;
      }
      continue;
    }
    if (ctrl) {
      l.coff_ += static_cast<size_t>(put);
      if (l.coff_ == l.ctrl_.size()) {
        if (l.close_queued_) {  // CLOSE is the last frame: the peer reads EOF next
          ::shutdown(l.fd_.get(), SHUT_WR);
          l.done_writing_ = true;
        } else {  // ABORT: the last but the goodbye this rank sends when it closes
          l.abort_sent_ = true;
        }
      }
      continue;
    }
    size_t left = static_cast<size_t>(put);
    uint64_t h = head;
    while (left > 0) {
      const size_t rest = sizeof(FrameHeader) + l.out_hdr_[h % l.n_].nbytes - l.woff_;
      if (left < rest) {
        l.woff_ += left;
        break;
      }
      left -= rest;
      l.woff_ = 0;
      ++h;
    }
    if (h != head) {
      l.out_head_.store(h, std::memory_order_release);
      home_->wake();  // the executor may wait for a free slot
    }
  }
  return moved;
}

// Reads frames into free slots until the socket is empty or the ring full.
// Returns whether bytes moved.
bool TcpTransport::pump_in(TcpLink& l) {
  if (!l.fd_.valid() || l.eof_ || !l.in_ready_) return false;
  // Closing or aborted: nobody consumes any more; keep the stream moving so
  // the peer's writes (and its ABORT or CLOSE frame) get through.
  const bool discard = stop_.load(std::memory_order_relaxed) || aborted_.load(std::memory_order_relaxed);
  static thread_local char sink[65536];
  bool moved = false, published = false;
  int frames = 0;
  while (frames < 256) {
    char* dst = nullptr;
    size_t want = 0;
    // A frame is only started with a free slot for it (a release wakes us).
    if (l.rstate_ == TcpLink::kHeader && !discard && !l.in_has_room()) break;
    switch (l.rstate_) {
      case TcpLink::kHeader:
        dst = l.rbytes_ + l.rgot_;
        want = sizeof(FrameHeader) - l.rgot_;
        break;
      case TcpLink::kPayload:
        dst = l.rdst_;
        want = l.rleft_;
        break;
      case TcpLink::kReason:
        dst = &l.rreason_[l.rreason_.size() - l.rleft_];
        want = l.rleft_;
        break;
      case TcpLink::kSkip:
        dst = sink;
        want = std::min(l.rleft_, sizeof sink);
        break;
    }
    ssize_t got = ::recv(l.fd_.get(), dst, want, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      l.in_ready_ = false;
      break;
    }
    if (got <= 0) {
      on_eof(l, got < 0 ? errno : 0);
      moved = true;
      break;
    }
    moved = true;
    const size_t n = static_cast<size_t>(got);
    if (l.rstate_ == TcpLink::kHeader) {
      l.rgot_ += n;
      if (l.rgot_ < sizeof(FrameHeader)) continue;
      l.rgot_ = 0;
      const FrameHeader& f = l.rhdr_;
      std::string why = tcp::decode_frame(l.rbytes_, sizeof l.rbytes_, slot_bytes_, &l.rhdr_);
      if (why.empty() && l.state_.load(std::memory_order_relaxed) == TcpLink::kPeerClosed) {
        why = "a frame after its goodbye";
      }
      if (!why.empty()) {
        // Nothing after a bad header can be trusted: stop reading and hang up.
        if (!discard) {
          fail_link(l, "rank " + std::to_string(l.peer_) + " (" + l.name_ + ") sent rank " +
                           std::to_string(rank_) +
                           " something that is not a valid ringcomm frame over TCP: " + why +
                           "; the connection was closed");
        }
        ::shutdown(l.fd_.get(), SHUT_RDWR);
        l.eof_ = true;
        break;
      }
      if (f.type == tcp::kData) {
        if (discard) {
          l.rleft_ = f.nbytes;
          l.rstate_ = f.nbytes ? TcpLink::kSkip : TcpLink::kHeader;
          continue;
        }
        if (l.posted_) {
          if (f.nbytes == std::min(l.post_seg_bytes_, l.post_left_) && f.segment == l.post_seg_ &&
              f.tag == l.post_tag_) {
            l.rdst_ = l.post_dst_;  // the posted segment: straight into the caller's memory
            l.rleft_ = f.nbytes;
            l.rstate_ = TcpLink::kPayload;
            l.rdirect_ = true;
            continue;
          }
          l.posted_ = false;  // not what was posted: this frame and the rest go to the ring
          l.post_over_.store(true, std::memory_order_release);
          published = true;
        }
        const uint64_t slot = l.in_tail_.load(std::memory_order_relaxed);
        l.in_hdr_[slot % l.n_] = tcp::data_header(f);
        l.rdst_ = l.in_data(slot) + f.payload_offset;
        l.rleft_ = f.nbytes;
        l.rstate_ = TcpLink::kPayload;
      } else if (f.type == tcp::kAbort) {
        l.rreason_.assign(f.nbytes, '\0');
        l.rleft_ = f.nbytes;
        l.rstate_ = TcpLink::kReason;
      } else if (f.type == tcp::kStatusQuery) {
        CallRecordView coll, p2p;
        {
          std::lock_guard<std::mutex> lk(mu_);
          coll = my_calls_[0];
          p2p = my_calls_[1];
        }
        {
          std::lock_guard<std::mutex> wlk(l.wmu_);
          if (!l.done_writing_ && !l.abort_queued_ && l.status_out_.size() < 64 * sizeof(FrameHeader)) {
            l.status_out_ += tcp::status_report(coll, p2p);
          }
        }
        continue;
      } else if (f.type == tcp::kStatusReport) {
        {
          std::lock_guard<std::mutex> lk(l.status_mu_);
          tcp::read_status_report(f, &l.peer_calls_[0], &l.peer_calls_[1]);
        }
        l.status_seen_.fetch_add(1, std::memory_order_release);
        continue;
      } else {  // kClose
        l.peer_goodbye_ = true;
        int open = TcpLink::kOpen;
        l.state_.compare_exchange_strong(open, TcpLink::kPeerClosed, std::memory_order_release);
        home_->wake();
        continue;
      }
      if (l.rleft_ != 0) continue;
    } else {
      if (l.rstate_ == TcpLink::kPayload) l.rdst_ += n;
      l.rleft_ -= n;
      if (l.rleft_ != 0) continue;
    }
    // A frame is complete.
    if (l.rstate_ == TcpLink::kPayload && l.rdirect_) {
      l.rdirect_ = false;
      const size_t n = l.rhdr_.nbytes;
      l.post_dst_ += n;
      l.post_left_ -= n;
      ++l.post_seg_;
      l.post_landed_.store(l.post_landed_.load(std::memory_order_relaxed) + n, std::memory_order_release);
      if (l.post_left_ == 0) {
        l.posted_ = false;
        l.post_over_.store(true, std::memory_order_release);
      }
      published = true;
      ++frames;
      frames_landed_.fetch_add(1, std::memory_order_relaxed);
    } else if (l.rstate_ == TcpLink::kPayload) {
      l.in_tail_.store(l.in_tail_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      published = true;
      ++frames;
    } else if (l.rstate_ == TcpLink::kReason) {
      l.peer_aborted_ = true;
      fail_link(l, readable_text(l.rreason_.empty() ? "aborted" : l.rreason_));
    }
    l.rstate_ = TcpLink::kHeader;
  }
  if (published) home_->wake();
  if (frames) frames_io_.fetch_add(static_cast<uint64_t>(frames), std::memory_order_relaxed);
  return moved;
}

bool TcpTransport::has_work() {
  const bool aborting = aborted_.load(std::memory_order_relaxed);
  const bool discard = aborting || stop_.load(std::memory_order_relaxed);
  if (dial_asked_.load(std::memory_order_acquire)) return true;
  for (TcpLink* lp : live_) {
    if (!lp->fd_.valid()) continue;
    TcpLink& l = *lp;
    if (l.out_ready_ && !l.done_writing_) {
      std::lock_guard<std::mutex> wlk(l.wmu_);
      if (l.woff_ || l.coff_ < l.ctrl_.size() || l.soff_ < l.status_out_.size()) return true;
      if (!aborting && l.out_pending()) return true;
    }
    if (l.in_ready_ && !l.eof_ && (discard || l.in_has_room())) return true;
  }
  return false;
}

void TcpTransport::io_loop() {
  struct epoll_event evs[64];
  bool connector_ready = true;
  for (;;) {
    const bool stopping = stop_.load(std::memory_order_acquire);
    const bool aborting = aborted_.load(std::memory_order_acquire);
    Clock::time_point now = Clock::now();
    if (connector_ready || dial_asked_.load(std::memory_order_acquire) || now >= connector_->next_timer() ||
        now - last_connector_step_ >= kConnectorPoll) {
      connector_ready = false;
      serve_connector(now);
    }
    bool moved = false;
    // Every link said goodbye or is gone, and none that is still connecting
    // holds segments (a send completes once its segments are queued).
    bool finished = true;
    bool timed = stopping;  // something has a deadline: wake up now and then
    if (stopping) {
      std::lock_guard<std::mutex> lk(links_mu_);
      for (auto& lp : owned_) {
        if (!lp->connected_.load(std::memory_order_relaxed) &&
            lp->state_.load(std::memory_order_relaxed) != TcpLink::kLost && lp->out_pending()) {
          finished = false;
        }
      }
    }
    for (TcpLink* lp : live_) {
      if (!lp->fd_.valid()) continue;
      TcpLink& l = *lp;
      std::unique_lock<std::mutex> wlk(l.wmu_);
      if (aborting && !l.abort_queued_) {
        l.abort_queued_ = true;
        l.abort_deadline_ = now + kAbortGrace;
        if (!l.done_writing_ && l.coff_ == 0) l.ctrl_ = tcp::control_frame(tcp::kAbort, local_abort());
      }
      if (stopping && !aborting && !l.close_queued_ && l.ctrl_.empty() && l.woff_ == 0 && !l.out_pending()) {
        l.close_queued_ = true;  // everything queued is in the kernel: say goodbye
        l.ctrl_ = tcp::control_frame(tcp::kClose);
      } else if (stopping && aborting && l.abort_sent_ && !l.close_queued_) {
        l.close_queued_ = true;  // closing after an abort: the goodbye follows the ABORT frame
        l.ctrl_ = tcp::control_frame(tcp::kClose);
        l.coff_ = 0;
      }
      moved |= pump_out(l);
      if (l.abort_queued_ && !l.abort_sent_ && !l.done_writing_ && now > l.abort_deadline_) {
        // The peer does not read: a reset reaches it anyway.
        struct linger lg{1, 0};
        ::setsockopt(l.fd_.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        std::lock_guard<std::mutex> rlk(l.rmu_);
        l.fd_.reset();
        l.done_writing_ = l.eof_ = true;
        continue;
      }
      wlk.unlock();
      {
        // The executor holds rmu_ only for a look at the socket or the read of
        // one small frame (recv_now): go round again rather than sleep on it.
        std::unique_lock<std::mutex> rlk(l.rmu_, std::try_to_lock);
        if (rlk.owns_lock()) {
          moved |= pump_in(l);
          if (l.broke_err_) {
            broken(l, l.broke_err_);
            l.broke_err_ = 0;
            moved = true;
          }
        } else {
          moved = true;
          std::this_thread::yield();
        }
      }
      if (l.abort_queued_ && !l.abort_sent_ && !l.done_writing_) timed = true;
      if (!l.done_writing_ && l.state_.load(std::memory_order_relaxed) != TcpLink::kFailed) finished = false;
    }
    if (stopping && (finished || Clock::now() >= close_deadline_)) return;
    if (moved) continue;
    io_sleeping_.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (has_work()) {
      io_sleeping_.store(0, std::memory_order_relaxed);
      continue;
    }
    int wait_ms = timed ? 10 : -1;
    const Clock::time_point timer = connector_->next_timer();
    if (timer != Clock::time_point::max()) {
      const auto until = std::chrono::duration_cast<std::chrono::milliseconds>(timer - Clock::now()).count() + 1;
      const int ms = static_cast<int>(std::max<long long>(0, std::min<long long>(until, 1000)));
      wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
    }
    int n = ::epoll_wait(epoll_.get(), evs, 64, wait_ms);
    io_sleeping_.store(0, std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.u64 == kEventKey) {
        uint64_t v;
        ssize_t r = ::read(event_.get(), &v, sizeof v);
        (void)r;
        continue;
      }
      if (evs[i].data.u64 == kConnectorKey) {
        connector_ready = true;
        continue;
      }
      TcpLink* l = links_[evs[i].data.u64].load(std::memory_order_relaxed);
      if (!l || !l->fd_.valid()) continue;
      const uint32_t e = evs[i].events;
      if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) l->in_ready_ = true;
      if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) l->out_ready_ = true;
      if (e & EPOLLERR) {
        // A reset shows here even while a full ring keeps us from reading.
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(l->fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) l->broke_err_ = err;  // (broken(), in the loop below, reports it)
      }
    }
  }
}

void TcpTransport::close(Clock::time_point deadline) {
  if (io_.joinable()) {
    close_deadline_ = deadline;
    stop_.store(true, std::memory_order_release);
    uint64_t one = 1;
    ssize_t r = ::write(event_.get(), &one, sizeof one);
    (void)r;
    io_.join();
  }
  shutdown_links();
  connector_.reset();
  listener_.reset();
}

// Closes the sockets. Unread bytes would make close() send a reset, which
// can destroy data the peer has not read yet: read them first.
void TcpTransport::shutdown_links() {
  char sink[4096];
  for (TcpLink* lp : live_) {
    if (!lp->fd_.valid()) continue;
    std::lock_guard<std::mutex> rlk(lp->rmu_);
    for (int i = 0; i < 256 && ::recv(lp->fd_.get(), sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
    lp->fd_.reset();
  }
}

}  // namespace ringcomm
