#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "ringcomm/types.h"

namespace ringcomm {
namespace {

std::string random_name() {
  // 128 random bits from the kernel: names cannot be guessed by other users.
  unsigned char bytes[16];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::read(fd, bytes, sizeof bytes) != static_cast<ssize_t>(sizeof bytes)) {
    if (fd >= 0) ::close(fd);
    throw Error("ringcomm: cannot read /dev/urandom to name a shared segment");
  }
  ::close(fd);
  static const char* hex = "0123456789abcdef";
  std::string name = "/ringcomm-";
  for (unsigned char b : bytes) {
    name += hex[b >> 4];
    name += hex[b & 15];
  }
  return name;
}

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

std::string errno_text() { return std::strerror(errno); }

}  // namespace

size_t Segment::slot_stride(size_t slot_bytes) { return kPage + round_up(slot_bytes + kPage, kPage); }

size_t Segment::slots_offset(int world) {
  return round_up(sizeof(SegmentControl) + sizeof(FifoControl) * static_cast<size_t>(world), kPage);
}

size_t Segment::total_bytes(int world, size_t slot_bytes, int nslots) {
  return slots_offset(world) + static_cast<size_t>(world) * nslots * slot_stride(slot_bytes);
}

Segment Segment::create(int world, int rank, size_t slot_bytes, int nslots) {
  Segment s;
  s.world_ = world;
  s.nslots_ = nslots;
  s.stride_ = slot_stride(slot_bytes);
  s.bytes_ = total_bytes(world, slot_bytes, nslots);
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    s.name_ = random_name();
    fd = ::shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw Error("ringcomm: shm_open(" + s.name_ + ") failed: " + errno_text());
  s.owner_ = true;
  s.unlinked_ = false;
  if (::ftruncate(fd, static_cast<off_t>(s.bytes_)) != 0) {
    std::string err = errno_text();
    ::close(fd);
    s.unlink();
    throw Error("ringcomm: cannot size shared segment to " + std::to_string(s.bytes_) +
                " bytes (is /dev/shm large enough?): " + err);
  }
  void* p = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    std::string err = errno_text();
    s.unlink();
    throw Error("ringcomm: mmap of shared segment failed: " + err);
  }
  s.base_ = static_cast<char*>(p);
  // Touch every page now: a first write into a fresh shared page costs more
  // than the copy itself, so pay it once at init rather than in a collective.
  std::memset(s.base_, 0, s.bytes_);
  auto* ctl = new (s.base_) SegmentControl();
  ctl->world = static_cast<uint32_t>(world);
  ctl->rank = static_cast<uint32_t>(rank);
  ctl->nslots = static_cast<uint32_t>(nslots);
  ctl->slot_bytes = slot_bytes;
  ctl->slot_stride = s.stride_;
  ctl->owner_pid = static_cast<int64_t>(::getpid());
  ctl->owner_base = reinterpret_cast<uint64_t>(s.base_);
  for (int i = 0; i < world; ++i) new (s.fifo(i)) FifoControl();
  std::atomic_thread_fence(std::memory_order_release);
  ctl->magic = kSegmentMagic;
  return s;
}

Segment Segment::open(const std::string& name, int world, int expected_rank, size_t slot_bytes,
                      int nslots) {
  Segment s;
  s.name_ = name;
  s.world_ = world;
  s.nslots_ = nslots;
  s.stride_ = slot_stride(slot_bytes);
  s.bytes_ = total_bytes(world, slot_bytes, nslots);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error("ringcomm: cannot open rank " + std::to_string(expected_rank) +
                "'s shared segment " + name + ": " + errno_text() +
                " (same host was assumed from hostname and boot id)");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != s.bytes_) {
    ::close(fd);
    throw Error("ringcomm: rank " + std::to_string(expected_rank) + "'s shared segment has " +
                std::to_string(st.st_size) + " bytes, expected " + std::to_string(s.bytes_) +
                " (do all ranks use the same RINGCOMM_SLOT_BYTES / RINGCOMM_SLOTS?)");
  }
  void* p = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw Error("ringcomm: mmap of " + name + " failed: " + errno_text());
  s.base_ = static_cast<char*>(p);
  const SegmentControl* ctl = s.control();
  if (ctl->magic != kSegmentMagic || ctl->world != static_cast<uint32_t>(world) ||
      ctl->rank != static_cast<uint32_t>(expected_rank) || ctl->slot_bytes != slot_bytes ||
      ctl->nslots != static_cast<uint32_t>(nslots)) {
    throw Error("ringcomm: shared segment " + name + " does not belong to rank " +
                std::to_string(expected_rank) + " of this communicator");
  }
  return s;
}

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    reset();
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    world_ = o.world_;
    nslots_ = o.nslots_;
    stride_ = o.stride_;
    owner_ = std::exchange(o.owner_, false);
    unlinked_ = std::exchange(o.unlinked_, true);
  }
  return *this;
}

Segment::~Segment() { reset(); }

void Segment::reset() {
  if (owner_) unlink();
  if (base_) ::munmap(base_, bytes_);
  base_ = nullptr;
}

void Segment::unlink() {
  if (owner_ && !unlinked_) {
    ::shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

FifoControl* Segment::fifo(int from) const {
  return reinterpret_cast<FifoControl*>(base_ + sizeof(SegmentControl)) + from;
}

char* Segment::slot(int from, uint64_t i) const {
  return base_ + slots_offset(world_) +
         (static_cast<size_t>(from) * nslots_ + static_cast<size_t>(i % nslots_)) * stride_;
}

}  // namespace ringcomm
