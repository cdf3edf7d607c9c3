#include "transport/shm/shm_transport.h"
#include "transport/shm/segment_header.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cerrno>
#include <cstddef>
#include <cstring>

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
  ShmLink(int rank, int peer, const Segment* inbox, const Segment* peer_inbox, size_t slot_bytes,
          int nslots)
      : rank_(rank),
        peer_(peer),
        inbox_(inbox),
        peer_inbox_(peer_inbox),
        out_(peer_inbox->fifo(rank)),
        in_(inbox->fifo(peer)),
        slot_bytes_(slot_bytes),
        nslots_(static_cast<uint64_t>(nslots)) {}

  size_t slot_bytes() const override { return slot_bytes_; }

  char* send_slot(uint32_t page_offset) override {
    uint64_t tail = out_->tail.load(std::memory_order_relaxed);
    if (tail - out_->head.load(std::memory_order_acquire) >= nslots_) return nullptr;
    send_pending_ = peer_inbox_->slot(rank_, tail);
    send_offset_ = page_offset % kPage;
    return send_pending_ + kPage + send_offset_;
  }

  void send_commit(const MsgHeader& header) override {
    MsgHeader h = header;
    h.payload_offset = send_offset_;
    std::memcpy(send_pending_, &h, sizeof h);
    out_->tail.store(out_->tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    ring(peer_inbox_->control());
  }

  const MsgHeader* recv_peek(const char** payload) override {
    uint64_t head = in_->head.load(std::memory_order_relaxed);
    if (in_->tail.load(std::memory_order_acquire) == head) return nullptr;
    const char* slot = inbox_->slot(peer_, head);
    auto* h = reinterpret_cast<const MsgHeader*>(slot);
    check_segment_header(*h, slot_bytes_, peer_);
    *payload = slot + kPage + h->payload_offset;
    return h;
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
};

ShmTransport::ShmTransport(int rank, int world, size_t slot_bytes, int nslots)
    : rank_(rank),
      world_(world),
      slot_bytes_(slot_bytes),
      nslots_(nslots),
      inbox_(Segment::create(world, rank, slot_bytes, nslots)) {}

ShmTransport::~ShmTransport() = default;

void ShmTransport::connect(const std::vector<std::string>& names) {
  if (static_cast<int>(names.size()) != world_) throw Error("ringcomm: connect: wrong peer count");
  peers_.clear();
  links_.clear();
  peers_.resize(world_);
  links_.resize(world_);
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || names[p].empty()) continue;  // empty: reached by another transport
    peers_[p] = Segment::open(names[p], world_, p, slot_bytes_, nslots_);
    links_[p] = std::make_unique<ShmLink>(rank_, p, &inbox_, &peers_[p], slot_bytes_, nslots_);
  }
}

Link* ShmTransport::link(int peer) { return links_[peer].get(); }

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
  if (!recheck()) {
    // Sleep in slices so deadlines and peers' abort flags are looked at.
    auto slice = std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(20));
    futex_wait(&ctl->bell, bell, slice);
  }
  ctl->sleeping.store(0, std::memory_order_relaxed);
}

void ShmTransport::wake() { ring(inbox_.control()); }

void ShmTransport::announce_abort(const std::string& why) {
  SegmentControl* ctl = inbox_.control();
  if (ctl->aborted.load()) return;
  size_t n = std::min(why.size(), sizeof(ctl->abort_reason) - 1);
  std::memcpy(ctl->abort_reason, why.data(), n);
  ctl->abort_reason[n] = 0;
  ctl->aborted.store(1, std::memory_order_release);
  for (int p = 0; p < world_; ++p) {
    if (p != rank_ && peers_.size() == static_cast<size_t>(world_) && peers_[p].mapped()) {
      SegmentControl* pc = peers_[p].control();
      pc->bell.fetch_add(1);
      futex_wake_all(&pc->bell);
    }
  }
}

std::string ShmTransport::peer_abort_reason(int peer) {
  if (peer == rank_ || peers_.size() != static_cast<size_t>(world_) || !peers_[peer].mapped()) return {};
  SegmentControl* pc = peers_[peer].control();
  if (!pc->aborted.load(std::memory_order_acquire)) return {};
  return std::string(pc->abort_reason, strnlen(pc->abort_reason, sizeof(pc->abort_reason)));
}

}  // namespace ringcomm
