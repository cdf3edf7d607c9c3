#include "transport/shm/segment.h"
#include "transport/shm/segment_header.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

#include "ringcomm/types.h"

namespace ringcomm {
namespace {

constexpr const char* kPrefix = "ringcomm-";

std::string random_hex() {
  // 128 random bits from the kernel: names cannot be guessed by other users.
  unsigned char bytes[16];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::read(fd, bytes, sizeof bytes) != static_cast<ssize_t>(sizeof bytes)) {
    if (fd >= 0) ::close(fd);
    throw Error("ringcomm: cannot read /dev/urandom to name a shared segment");
  }
  ::close(fd);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

std::string errno_text() { return std::strerror(errno); }

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 20) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// "ringcomm-<pidns>-<pid>-<32 hex>" (without the leading slash) -> pidns, pid.
bool parse_name(const std::string& base, uint64_t* pidns, int64_t* pid) {
  if (base.compare(0, std::strlen(kPrefix), kPrefix) != 0) return false;
  std::string rest = base.substr(std::strlen(kPrefix));
  size_t a = rest.find('-');
  if (a == std::string::npos) return false;
  size_t b = rest.find('-', a + 1);
  if (b == std::string::npos) return false;
  std::string ns = rest.substr(0, a), p = rest.substr(a + 1, b - a - 1), hex = rest.substr(b + 1);
  if (!all_digits(ns) || !all_digits(p) || hex.size() != 32) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  *pidns = std::strtoull(ns.c_str(), nullptr, 10);
  *pid = std::strtoll(p.c_str(), nullptr, 10);
  return *pid > 0;
}

// Whether process `pid` (of this pid namespace) is gone: no such process, or
// a zombie (killed, not yet reaped by its parent).
bool process_gone(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", static_cast<long long>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');
  return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

}  // namespace

uint64_t own_pid_namespace() {
  struct stat st;
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

uint64_t process_start_time(int64_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", static_cast<long long>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Field 22 (starttime); fields after the command name, which may hold
  // spaces and parentheses, start after its last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  ++p;
  for (int field = 3; field <= 22; ++field) {
    while (*p == ' ') ++p;
    if (!*p) return 0;
    if (field == 22) return std::strtoull(p, nullptr, 10);
    while (*p && *p != ' ') ++p;
  }
  return 0;
}

size_t Segment::slot_stride(size_t slot_bytes) { return kPage + slot_data_bytes(slot_bytes); }

size_t Segment::slots_offset(size_t nfifos) {
  return round_up(sizeof(SegmentControl) + sizeof(FifoControl) * nfifos, kPage);
}

void Segment::layout(int world, int owner, const std::vector<int>& members, size_t slot_bytes, int nslots) {
  nslots_ = nslots;
  stride_ = slot_stride(slot_bytes);
  fifo_of_.assign(static_cast<size_t>(world), -1);
  nfifos_ = 0;
  for (int m : members) {
    if (m < 0 || m >= world) throw Error("ringcomm: shared-memory member rank " + std::to_string(m) + " out of range");
    if (m == owner) continue;
    if (fifo_of_[m] >= 0) throw Error("ringcomm: shared-memory member rank " + std::to_string(m) + " listed twice");
    fifo_of_[m] = static_cast<int32_t>(nfifos_++);
  }
  bytes_ = slots_offset(nfifos_) + nfifos_ * static_cast<size_t>(nslots) * stride_;
}

std::string Segment::fresh_name() {
  return std::string("/") + kPrefix + std::to_string(own_pid_namespace()) + "-" + std::to_string(::getpid()) + "-" +
         random_hex();
}

bool Segment::valid_name(const std::string& name) {
  uint64_t ns;
  int64_t pid;
  return name.size() > 1 && name[0] == '/' && parse_name(name.substr(1), &ns, &pid);
}

void Segment::unlink_name(const std::string& name) {
  if (valid_name(name)) ::shm_unlink(name.c_str());
}

int Segment::sweep_orphans() {
  const uint64_t my_ns = own_pid_namespace();
  if (my_ns == 0) return 0;
  DIR* d = ::opendir("/dev/shm");
  if (!d) return 0;
  int removed = 0;
  const uid_t me = ::geteuid();
  while (struct dirent* e = ::readdir(d)) {
    std::string base = e->d_name;
    uint64_t ns;
    int64_t pid;
    if (!parse_name(base, &ns, &pid) || ns != my_ns) continue;
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != me) continue;
    if (process_gone(pid) && ::shm_unlink(("/" + base).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

Segment Segment::create(int world, int rank, const std::vector<int>& members, size_t slot_bytes, int nslots) {
  Segment s;
  s.layout(world, rank, members, slot_bytes, nslots);
  void* p = MAP_FAILED;
  if (s.nfifos_ == 0) {
    // No peer maps it: private memory, nothing to name or leak.
    p = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("ringcomm: mmap of the control block failed: " + errno_text());
  } else {
    sweep_orphans();
    int fd = -1;
    const std::string stem =
        std::string("/") + kPrefix + std::to_string(own_pid_namespace()) + "-" + std::to_string(::getpid()) + "-";
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      s.name_ = stem + random_hex();
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
    p = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string err = errno_text();
      ::close(fd);
      s.unlink();
      throw Error("ringcomm: mmap of shared segment failed: " + err);
    }
    s.fd_ = fd;
    s.lockable_ = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  }
  s.base_ = static_cast<char*>(p);
  // Touch every page now: a first write into a fresh shared page costs more
  // than the copy itself, so pay it once at init rather than in a collective.
  std::memset(s.base_, 0, s.bytes_);
  auto* ctl = new (s.base_) SegmentControl();
  ctl->world = static_cast<uint32_t>(world);
  ctl->rank = static_cast<uint32_t>(rank);
  ctl->nslots = static_cast<uint32_t>(nslots);
  ctl->members = static_cast<uint32_t>(members.size());
  ctl->slot_bytes = slot_bytes;
  ctl->slot_stride = s.stride_;
  ctl->owner_pid = static_cast<int64_t>(::getpid());
  ctl->owner_pidns = own_pid_namespace();
  ctl->owner_starttime = process_start_time(ctl->owner_pid);
  ctl->owner_base = reinterpret_cast<uint64_t>(s.base_);
  ctl->pad_lock = s.lockable_ ? 1 : 0;
  for (size_t i = 0; i < s.nfifos_; ++i) new (reinterpret_cast<FifoControl*>(s.base_ + sizeof(SegmentControl)) + i) FifoControl();
  std::atomic_thread_fence(std::memory_order_release);
  ctl->magic = kSegmentMagic;
  return s;
}

Segment Segment::open(const std::string& name, int world, int expected_rank, const std::vector<int>& members,
                      size_t slot_bytes, int nslots) {
  const std::string who = "rank " + std::to_string(expected_rank) + "'s shared segment";
  if (!valid_name(name)) throw Error("ringcomm: " + who + " has a malformed name in the store: '" + name + "'");
  Segment s;
  s.name_ = name;
  s.layout(world, expected_rank, members, slot_bytes, nslots);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error("ringcomm: cannot open " + who + " " + name + ": " + errno_text() +
                " (same host was assumed from hostname and boot id)");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != s.bytes_) {
    ::close(fd);
    throw Error("ringcomm: " + who + " has " + std::to_string(st.st_size) + " bytes, expected " +
                std::to_string(s.bytes_) + " (do all ranks use the same RINGCOMM_SLOT_BYTES / RINGCOMM_SLOTS?)");
  }
  void* p = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    std::string err = errno_text();
    ::close(fd);
    throw Error("ringcomm: mmap of " + name + " failed: " + err);
  }
  s.fd_ = fd;
  s.base_ = static_cast<char*>(p);
  const SegmentControl* ctl = s.control();
  s.lockable_ = ctl->pad_lock == 1;
  if (ctl->magic != kSegmentMagic || ctl->world != static_cast<uint32_t>(world) ||
      ctl->rank != static_cast<uint32_t>(expected_rank) || ctl->slot_bytes != slot_bytes ||
      ctl->nslots != static_cast<uint32_t>(nslots) || ctl->members != members.size()) {
    throw Error("ringcomm: shared segment " + name + " does not belong to rank " + std::to_string(expected_rank) +
                " of this communicator");
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
    nslots_ = o.nslots_;
    stride_ = o.stride_;
    nfifos_ = o.nfifos_;
    fifo_of_ = std::move(o.fifo_of_);
    owner_ = std::exchange(o.owner_, false);
    unlinked_ = std::exchange(o.unlinked_, true);
    fd_ = std::exchange(o.fd_, -1);
    lockable_ = std::exchange(o.lockable_, false);
  }
  return *this;
}

Segment::~Segment() { reset(); }

void Segment::reset() {
  if (owner_) unlink();
  if (base_) ::munmap(base_, bytes_);
  base_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool Segment::owner_gone() const {
  if (owner_ || fd_ < 0 || !lockable_) return false;
  if (::flock(fd_, LOCK_SH | LOCK_NB) != 0) return false;  // EWOULDBLOCK: the owner holds it
  ::flock(fd_, LOCK_UN);
  return true;
}

void Segment::unlink() {
  if (owner_ && !unlinked_) {
    ::shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

FifoControl* Segment::fifo(int from) const {
  return reinterpret_cast<FifoControl*>(base_ + sizeof(SegmentControl)) + fifo_of_[from];
}

char* Segment::slot(int from, uint64_t i) const {
  return base_ + slots_offset(nfifos_) +
         (static_cast<size_t>(fifo_of_[from]) * nslots_ + static_cast<size_t>(i % nslots_)) * stride_;
}

}  // namespace ringcomm
