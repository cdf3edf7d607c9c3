#include "transport/shm/shm_transport.h"
#include "transport/shm/segment_header.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "ringcomm/text.h"
#include "ringcomm/types.h"

namespace ringcomm {
namespace {

// futex calls on memory shared between processes (no FUTEX_PRIVATE_FLAG).
void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, Clock::duration d) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  if (ns <= 0) return;
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Wakes the owner of `ctl` if it is (about to be) asleep. The seq_cst fence
// pairs with the one in ShmTransport::sleep: either the sleeper sees our
// counter update in its recheck, or we see its sleeping flag here.
void ring(SegmentControl* ctl) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (ctl->sleeping.load(std::memory_order_relaxed)) {
    ctl->bell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&ctl->bell);
  }
}

}  // namespace

// One peer: the FIFO to it lives in its inbox, the FIFO from it in ours.
class ShmLink : public Link {
 public:
  ShmLink(ShmTransport* owner, int rank, int peer, const Segment* inbox, const Segment* peer_inbox,
          size_t slot_bytes, int nslots, SlotStoreMode stores)
      : owner_(owner),
        rank_(rank),
        peer_(peer),
        inbox_(inbox),
        peer_inbox_(peer_inbox),
        out_(peer_inbox->fifo(rank)),
        in_(inbox->fifo(peer)),
        slot_bytes_(slot_bytes),
        nslots_(static_cast<uint64_t>(nslots)),
        stores_(stores),
        streaming_(stores == SlotStoreMode::kStreamed) {}

  size_t slot_bytes() const override { return slot_bytes_; }

  char* send_slot(uint32_t page_offset, size_t nbytes) override {
    uint64_t tail = out_->tail.load(std::memory_order_relaxed);
    if (tail - out_->head.load(std::memory_order_acquire) >= nslots_) {
      // A full FIFO to a peer that is gone never drains.
      auto full = [&] { return tail - out_->head.load(std::memory_order_acquire) >= nslots_; };
      if (!owner_->check_gone(peer_, full)) return nullptr;
    }
    send_pending_ = peer_inbox_->slot(rank_, tail);
    send_offset_ = payload_offset_for(tail / nslots_, page_offset, nbytes, slot_bytes_);
    send_written_ = kUntimed;  // (fill_slot says how, if the payload is a plain copy)
    return send_pending_ + kPage + send_offset_;
  }

  void send_commit(const MsgHeader& header) override {
    MsgHeader h = header;
    h.payload_offset = send_offset_;
    std::memcpy(send_pending_, &h, sizeof h);
    send_pending_[sizeof h] = static_cast<char>(send_written_);
    out_->tail.store(out_->tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    ring(peer_inbox_->control());
  }

  const MsgHeader* recv_peek(const char** payload) override {
    uint64_t head = in_->head.load(std::memory_order_relaxed);
    if (in_->tail.load(std::memory_order_acquire) == head) {
      // Nothing left from a peer that is gone: nothing will come. (What it
      // sent before it closed is read: its last send may land between the
      // look above and the sight of its departure.)
      auto empty = [&] { return in_->tail.load(std::memory_order_acquire) == head; };
      if (!owner_->check_gone(peer_, empty)) return nullptr;
    }
    const char* slot = inbox_->slot(peer_, head);
    // The header is copied out of shared memory before it is checked: what
    // the caller acts on is what was checked, whatever the peer writes later.
    std::memcpy(&peeked_, slot, sizeof peeked_);
    check_segment_header(peeked_, slot_bytes_, peer_);
    const uint8_t written = static_cast<uint8_t>(slot[sizeof peeked_]);
    peeked_written_ = written <= kStreamed ? written : kUntimed;  // (a byte of shared memory: checked)
    *payload = slot + kPage + peeked_.payload_offset;
    return &peeked_;
  }

  // Slot stores (Link::fill_slot, slot_stores.h). The writer writes its
  // slots of at least kStreamMin bytes the way it holds cheaper (cached
  // stores at first) and every kProbeEvery-th such slot the other way; the
  // slot's header page says which way. Each end times its copies of at least
  // kTimedMin bytes (every probe, one in four of the others) and keeps a
  // moving average of seconds per byte for each way: the writer its fills,
  // the reader its copies and reductions out of the slots, which it publishes
  // in the FIFO's control (read_cost, once it has kMinSamples of a way). On
  // each news from the reader, the writer switches if the other way's fill
  // plus read cost is under 0.7x the current way's (SlotStoreRule). So a
  // placement of the cores where lines move slowly between their caches
  // turns to non-temporal stores within a few dozen slots, and back when it
  // passes. RINGCOMM_SLOT_STORES=cached / streamed fixes the way (untimed).
  bool stream_slot(size_t n) override {
    if (stores_ != SlotStoreMode::kAuto) return streaming_;  // forced: untimed
    if (n < kStreamMin) return false;  // small: cached, not a sample (kUntimed)
    fill_probe_ = ++slots_written_ % kProbeEvery == 0;
    const bool streamed = streaming_ != fill_probe_;
    send_written_ = streamed ? kStreamed : kCached;
    return streamed;
  }

  bool time_fill(size_t n) override {
    return n >= kTimedMin && send_written_ != kUntimed && (fill_probe_ || (++fills_seen_ & 3) == 0);
  }

  void filled(size_t n, double seconds) override {
    const int way = send_written_ - 1;
    SlotStoreRule::average(&write_cost_[way], seconds / static_cast<double>(n));
    if (write_samples_[way] < SlotStoreRule::kMinSamples) ++write_samples_[way];
    // Decided again only on news from the reader (its costs count from
    // kMinSamples copies of each way; until then it publishes none).
    const uint64_t heard = out_->read_samples.load(std::memory_order_acquire);
    if (heard == read_samples_heard_) return;
    read_samples_heard_ = heard;
    const double read_cost[2] = {SlotStoreRule::cost_from_bits(out_->read_cost[0].load(std::memory_order_relaxed)),
                                 SlotStoreRule::cost_from_bits(out_->read_cost[1].load(std::memory_order_relaxed))};
    double write_cost[2];
    for (int i = 0; i < 2; ++i) write_cost[i] = write_samples_[i] >= SlotStoreRule::kMinSamples ? write_cost_[i] : 0;
    streaming_ = SlotStoreRule::choose(streaming_, write_cost, read_cost);
  }

  bool time_copy_out(size_t n) override {
    if (n < kTimedMin || peeked_written_ == kUntimed) return false;
    // The writer's probes are the slots written the way fewer slots are.
    majority_ = std::max(-16, std::min(16, majority_ + (peeked_written_ == kStreamed ? 1 : -1)));
    const bool probe = (peeked_written_ == kStreamed) != (majority_ > 0);
    return probe || (++copies_seen_ & 3) == 0;
  }

  void copied_out(size_t n, double seconds) override {
    const int way = peeked_written_ - 1;
    SlotStoreRule::average(&read_cost_[way], seconds / static_cast<double>(n));
    if (read_samples_[way] < SlotStoreRule::kMinSamples) ++read_samples_[way];
    if (read_samples_[way] < SlotStoreRule::kMinSamples) return;  // (publishes none yet)
    in_->read_cost[way].store(SlotStoreRule::bits_of(read_cost_[way]), std::memory_order_relaxed);
    in_->read_samples.fetch_add(1, std::memory_order_release);
  }

  // Cross-memory attach: one copy from the peer's address space to ours.
  void read_remote(void* dst, uint64_t remote_addr, size_t nbytes) override {
    const pid_t pid = static_cast<pid_t>(peer_inbox_->control()->owner_pid);
    char* out = static_cast<char*>(dst);
    while (nbytes > 0) {
      struct iovec local{out, nbytes};
      struct iovec remote{reinterpret_cast<void*>(remote_addr), nbytes};
      ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (got <= 0) {
        throw Error("ringcomm: reading rank " + std::to_string(peer_) + "'s buffer (pid " +
                    std::to_string(pid) + ") failed: " + (got < 0 ? std::strerror(errno) : "no data"));
      }
      out += got;
      remote_addr += static_cast<uint64_t>(got);
      nbytes -= static_cast<size_t>(got);
    }
  }

  void ack_pull(uint64_t seq) override {
    peer_inbox_->fifo(rank_)->pulled.store(seq, std::memory_order_release);
    ring(peer_inbox_->control());
  }

  uint64_t pulled() override { return inbox_->fifo(peer_)->pulled.load(std::memory_order_acquire); }

  bool probe_read() {
    const SegmentControl* ctl = peer_inbox_->control();
    uint64_t magic = 0;
    struct iovec local{&magic, sizeof magic};
    struct iovec remote{reinterpret_cast<void*>(ctl->owner_base + offsetof(SegmentControl, magic)),
                        sizeof magic};
    ssize_t got = process_vm_readv(static_cast<pid_t>(ctl->owner_pid), &local, 1, &remote, 1, 0);
    return got == static_cast<ssize_t>(sizeof magic) && magic == kSegmentMagic;
  }

  void recv_release() override {
    in_->head.store(in_->head.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    ring(peer_inbox_->control());  // the sender may be waiting for a free slot
  }

 private:
  ShmTransport* owner_;
  int rank_;
  int peer_;
  const Segment* inbox_;
  const Segment* peer_inbox_;
  FifoControl* out_;
  FifoControl* in_;
  size_t slot_bytes_;
  uint64_t nslots_;
  char* send_pending_ = nullptr;
  uint32_t send_offset_ = 0;
  MsgHeader peeked_;  // the header of the oldest received segment, as checked
  // How a slot's payload was written (the byte after its header).
  static constexpr uint8_t kUntimed = 0, kCached = 1, kStreamed = 2;
  static constexpr uint64_t kProbeEvery = 16;
  static constexpr size_t kStreamMin = 4 << 10;
  static constexpr size_t kTimedMin = 16 << 10;
  SlotStoreMode stores_;
  // Writer.
  bool streaming_;
  bool fill_probe_ = false;
  uint8_t send_written_ = kUntimed;
  uint64_t slots_written_ = 0;
  uint64_t fills_seen_ = 0;
  double write_cost_[2] = {0, 0};  // seconds per byte filled: cached, streamed
  int write_samples_[2] = {0, 0};  // (counted up to kMinSamples)
  uint64_t read_samples_heard_ = 0;
  // Reader.
  uint8_t peeked_written_ = kUntimed;
  int majority_ = 0;  // > 0: most slots come streamed
  uint64_t copies_seen_ = 0;
  double read_cost_[2] = {0, 0};  // seconds per byte copied out: cached, streamed
  int read_samples_[2] = {0, 0};  // (counted up to kMinSamples)
};

ShmTransport::ShmTransport(int rank, int world, size_t slot_bytes, int nslots, SlotStoreMode stores)
    : rank_(rank),
      world_(world),
      slot_bytes_(slot_bytes),
      nslots_(nslots),
      stores_(stores),
      pidfds_(world, -1),
      gone_(world) {}

ShmTransport::~ShmTransport() {
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

std::string ShmTransport::create_inbox(const std::vector<int>& members) {
  if (inbox_.mapped()) throw Error("ringcomm: the shared-memory inbox exists already");
  members_ = members;
  inbox_ = Segment::create(world_, rank_, members, slot_bytes_, nslots_);
  return inbox_.name();
}

bool ShmTransport::reaches(int peer) const {
  return peer >= 0 && peer < world_ && links_.size() == static_cast<size_t>(world_) && links_[peer] != nullptr;
}

uint64_t ShmTransport::read_cost_updates(int peer) const {
  if (!reaches(peer) || peer == rank_ || !inbox_.mapped()) return 0;
  return inbox_.fifo(peer)->read_samples.load(std::memory_order_acquire);
}

namespace {

int open_pidfd(int64_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

void ShmTransport::connect(const std::vector<std::string>& names) {
  if (static_cast<int>(names.size()) != world_) throw Error("ringcomm: connect: wrong peer count");
  if (!inbox_.mapped()) throw Error("ringcomm: connect before the inbox was created");
  peers_.clear();
  links_.clear();
  peer_controls_.clear();
  peers_.resize(world_);
  links_.resize(world_);
  const uint64_t my_ns = own_pid_namespace();
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || names[p].empty()) continue;  // empty: reached by another transport
    peers_[p] = Segment::open(names[p], world_, p, members_, slot_bytes_, nslots_);
    links_[p] = std::make_unique<ShmLink>(this, rank_, p, &inbox_, &peers_[p], slot_bytes_, nslots_, stores_);
    peer_controls_.push_back(peers_[p].control());
    // Watch the peer's process where its pid means something here (same pid
    // namespace) and is still the process that created the segment.
    const SegmentControl* pc = peers_[p].control();
    if (my_ns != 0 && pc->owner_pidns == my_ns && pc->owner_pid > 0) {
      int fd = open_pidfd(pc->owner_pid);
      if (fd < 0 && errno == ESRCH) {
        gone_[p] = "rank " + std::to_string(p) + " (pid " + std::to_string(pc->owner_pid) + ") is dead";
      } else if (fd >= 0) {
        if (pc->owner_starttime != 0 && process_start_time(pc->owner_pid) != pc->owner_starttime) {
          ::close(fd);  // the pid was reused: the owner is gone
          gone_[p] = "rank " + std::to_string(p) + " (pid " + std::to_string(pc->owner_pid) + ") is dead";
        } else {
          pidfds_[p] = fd;
        }
      }
    }
  }
}

Link* ShmTransport::link(int peer) {
  ShmLink* l = links_.size() == static_cast<size_t>(world_) ? links_[peer].get() : nullptr;
  if (!l) throw Error("ringcomm: rank " + std::to_string(rank_) + " has no shared-memory link to rank " + std::to_string(peer));
  return l;
}

void ShmTransport::check_gone(int peer) {
  const SegmentControl* pc = peers_[peer].control();
  // The most telling reason first: an abort names its cause, a departure is
  // orderly, a death is all that is left to say.
  if (pc->aborted.load(std::memory_order_acquire)) {
    throw PeerLostError("rank " + std::to_string(peer) + " aborted: " +
                        readable_text(std::string(pc->abort_reason, strnlen(pc->abort_reason, sizeof(pc->abort_reason)))));
  }
  if (pc->departed.load(std::memory_order_acquire)) {
    throw PeerLostError("rank " + std::to_string(peer) + " closed its communicator (finalize / close) while rank " +
                        std::to_string(rank_) + " still needed it");
  }
  if (!gone_[peer].empty()) throw PeerLostError(gone_[peer]);
}

bool ShmTransport::peer_aborted(int peer) const {
  return peers_[peer].control()->aborted.load(std::memory_order_acquire);
}

bool ShmTransport::any_peer_aborted() {
  for (const SegmentControl* pc : peer_controls_) {
    if (pc->aborted.load(std::memory_order_relaxed)) return true;
  }
  return false;
}

// Reads only what other threads never change (the peer's segment, its lock),
// not gone_ / pidfds_, which poll_peers updates from the calling thread.
std::string ShmTransport::peer_gone(int peer) {
  if (peer == rank_ || peers_.size() != static_cast<size_t>(world_) || !peers_[peer].mapped()) return {};
  if (peers_[peer].control()->departed.load(std::memory_order_acquire)) {
    return "rank " + std::to_string(peer) + " closed its communicator";
  }
  if (peers_[peer].owner_gone()) {
    return "rank " + std::to_string(peer) + " (pid " + std::to_string(peers_[peer].control()->owner_pid) +
           ") died: its process exited without closing the communicator";
  }
  return {};
}

void ShmTransport::poll_peers() {
  struct pollfd fds[64];
  int who[64];
  int n = 0;
  auto flush = [&] {
    if (n == 0) return;
    if (::poll(fds, static_cast<nfds_t>(n), 0) > 0) {
      for (int i = 0; i < n; ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          const int p = who[i];
          gone_[p] = "rank " + std::to_string(p) + " (pid " + std::to_string(peers_[p].control()->owner_pid) +
                     ") died: its process exited without closing the communicator";
          ::close(pidfds_[p]);
          pidfds_[p] = -1;
        }
      }
    }
    n = 0;
  };
  for (int p = 0; p < world_; ++p) {
    if (pidfds_[p] < 0) {
      // No pidfd (another pid namespace, or pidfd_open unavailable): the
      // segment's lock tells instead. An orderly close is not a death.
      if (gone_[p].empty() && peers_[p].mapped() && !peers_[p].control()->departed.load() && peers_[p].owner_gone()) {
        gone_[p] = "rank " + std::to_string(p) + " died: its process exited without closing the communicator";
      }
      continue;
    }
    fds[n].fd = pidfds_[p];
    fds[n].events = POLLIN;
    fds[n].revents = 0;
    who[n++] = p;
    if (n == 64) flush();
  }
  flush();
}

bool ShmTransport::probe_remote_read() {
  remote_read_ok_ = true;
  for (int p = 0; p < world_; ++p) {
    if (links_[p] && !links_[p]->probe_read()) remote_read_ok_ = false;
  }
  return remote_read_ok_;
}

void ShmTransport::sleep(Clock::time_point until, const std::function<bool()>& recheck) {
  SegmentControl* ctl = inbox_.control();
  uint32_t bell = ctl->bell.load(std::memory_order_acquire);
  ctl->sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!recheck() && !ctl->aborted.load(std::memory_order_acquire)) {
    // Sleep in slices so deadlines, peers' flags and their processes are looked at.
    auto slice = std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(20));
    futex_wait(&ctl->bell, bell, slice);
  }
  ctl->sleeping.store(0, std::memory_order_relaxed);
}

void ShmTransport::wake() {
  if (inbox_.mapped()) ring(inbox_.control());
}

void ShmTransport::announce_abort(const std::string& why) {
  if (!inbox_.mapped()) return;
  SegmentControl* ctl = inbox_.control();
  if (ctl->aborted.load()) return;
  const size_t n = utf8_cut(why, sizeof(ctl->abort_reason) - 1);
  std::memcpy(ctl->abort_reason, why.data(), n);
  ctl->abort_reason[n] = 0;
  ctl->aborted.store(1, std::memory_order_release);
  // Wake this rank's own sleeper (a call blocked in another thread) and the peers.
  ctl->bell.fetch_add(1);
  futex_wake_all(&ctl->bell);
  for (int p = 0; p < world_; ++p) {
    if (p != rank_ && peers_.size() == static_cast<size_t>(world_) && peers_[p].mapped()) {
      SegmentControl* pc = peers_[p].control();
      pc->bell.fetch_add(1);
      futex_wake_all(&pc->bell);
    }
  }
}

void ShmTransport::announce_departure() {
  if (!inbox_.mapped()) return;
  SegmentControl* ctl = inbox_.control();
  ctl->departed.store(1, std::memory_order_release);
  for (int p = 0; p < world_; ++p) {
    if (p != rank_ && peers_.size() == static_cast<size_t>(world_) && peers_[p].mapped()) {
      SegmentControl* pc = peers_[p].control();
      pc->bell.fetch_add(1);
      futex_wake_all(&pc->bell);
    }
  }
}

std::string ShmTransport::local_abort_reason() {
  if (!inbox_.mapped()) return {};
  SegmentControl* ctl = inbox_.control();
  if (!ctl->aborted.load(std::memory_order_acquire)) return {};
  return readable_text(std::string(ctl->abort_reason, strnlen(ctl->abort_reason, sizeof(ctl->abort_reason))));
}

std::string ShmTransport::peer_abort_reason(int peer) {
  if (peer == rank_ || peers_.size() != static_cast<size_t>(world_) || !peers_[peer].mapped()) return {};
  SegmentControl* pc = peers_[peer].control();
  if (!pc->aborted.load(std::memory_order_acquire)) return {};
  return readable_text(std::string(pc->abort_reason, strnlen(pc->abort_reason, sizeof(pc->abort_reason))));
}

void ShmTransport::record_call(const CallRecordView& call) {
  if (!inbox_.mapped()) return;
  CallRecord& r = inbox_.control()->last_call[call.p2p ? 1 : 0];
  const uint32_t v = r.version.load(std::memory_order_relaxed);
  r.version.store(v + 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  r.kind = call.kind;
  r.state = call.state;
  r.p2p = call.p2p;
  r.peer = call.peer;
  r.seq = call.seq;
  r.version.store(v + 2, std::memory_order_release);
}

bool ShmTransport::peer_call(int peer, bool p2p, CallRecordView* out) {
  if (peer == rank_ || peers_.size() != static_cast<size_t>(world_) || !peers_[peer].mapped()) return false;
  const CallRecord& r = peers_[peer].control()->last_call[p2p ? 1 : 0];
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint32_t v = r.version.load(std::memory_order_acquire);
    if (v & 1) continue;
    CallRecordView c;
    c.kind = r.kind;
    c.state = r.state;
    c.p2p = r.p2p;
    c.peer = r.peer;
    c.seq = r.seq;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.version.load(std::memory_order_relaxed) == v) {
      *out = c;
      return true;
    }
  }
  return false;
}

}  // namespace ringcomm
