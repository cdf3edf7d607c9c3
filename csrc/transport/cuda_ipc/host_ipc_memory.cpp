#include "transport/cuda_ipc/host_ipc_memory.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ringcomm/reducer.h"
#include "transport/shm/segment.h"

namespace ringcomm {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Whether process `pid` is gone: no /proc entry, or a zombie (killed, not yet
// reaped by its parent).
bool process_dead(int64_t pid) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", static_cast<long long>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return errno == ENOENT;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');
  if (!p || !p[1] || !p[2]) return false;
  return p[2] == 'Z' || p[2] == 'X';
}

uint64_t load(const uint64_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }

// Waits spin, then yield, then sleep: ranks may outnumber cores.
class Backoff {
 public:
  explicit Backoff(const IpcBounds& b) : b_(b), start_(std::chrono::steady_clock::now()), last_check_(start_) {}
  // After a wait was reached: its check (the peer's stamp) must hold.
  void check(const IpcWait& w) {
    if (w.check && load(w.check) != w.check_value) fail(IpcAbortKind::kMismatch, w.peer);
  }
  // Called when nothing progressed; `peer`: one rank being waited for.
  // Throws IpcWaitFailed after setting every rank's abort word.
  void pause(int peer) {
    ++spins_;
    if (spins_ < 256) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - start_ < std::chrono::milliseconds(2)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (const uint64_t w = load(b_.abort_word)) throw IpcWaitFailed(w);
    if (now - last_check_ > std::chrono::milliseconds(20)) {
      last_check_ = now;
      if (b_.peer_pids && peer >= 0 && process_dead(b_.peer_pids[peer])) fail(IpcAbortKind::kPeerDied, peer);
    }
    if (now > b_.deadline) fail(IpcAbortKind::kTimeout, peer);
  }

 private:
  [[noreturn]] void fail(IpcAbortKind kind, int peer) {
    const uint64_t mine = ipc_abort_word(kind, b_.rank, peer);
    for (uint64_t* w : b_.peer_abort_words) {
      uint64_t expected = 0;
      __atomic_compare_exchange_n(w, &expected, mine, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    const uint64_t w = load(b_.abort_word);
    throw IpcWaitFailed(w ? w : mine);
  }

  const IpcBounds& b_;
  std::chrono::steady_clock::time_point start_, last_check_;
  unsigned spins_ = 0;
};

}  // namespace

HostIpcMemory::~HostIpcMemory() { release(); }

char* HostIpcMemory::allocate(size_t bytes) {
  if (own_.base) throw Error("cuda_ipc (host): the buffer is allocated already");
  Segment::sweep_orphans();
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name_ = Segment::fresh_name();
    fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw Error("cuda_ipc (host): shm_open(" + name_ + ") failed: " + errno_text());
  unlinked_ = false;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string err = errno_text();
    ::close(fd);
    exported();
    throw Error("cuda_ipc (host): cannot size the buffer to " + std::to_string(bytes) + " bytes: " + err);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const std::string err = errno_text();
  ::close(fd);
  if (p == MAP_FAILED) {
    exported();
    throw Error("cuda_ipc (host): mmap of the buffer failed: " + err);
  }
  std::memset(p, 0, bytes);  // pre-fault: first writes into fresh shared pages are slow
  own_ = {static_cast<char*>(p), bytes};
  return own_.base;
}

char* HostIpcMemory::open_peer(int peer, const std::string& handle, size_t bytes) {
  const std::string who = "rank " + std::to_string(peer) + "'s cuda_ipc buffer";
  if (!Segment::valid_name(handle)) throw Error("cuda_ipc (host): " + who + " has a malformed name: '" + handle + "'");
  int fd = ::shm_open(handle.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("cuda_ipc (host): cannot open " + who + " " + handle + ": " + errno_text());
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    throw Error("cuda_ipc (host): " + who + " holds " + std::to_string(st.st_size) + " bytes, expected " +
                std::to_string(bytes) + " (another geometry: do all ranks use the same settings?)");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const std::string err = errno_text();
  ::close(fd);
  if (p == MAP_FAILED) throw Error("cuda_ipc (host): mmap of " + who + " failed: " + err);
  peers_.push_back({static_cast<char*>(p), bytes});
  return peers_.back().base;
}

void HostIpcMemory::exported() {
  if (!unlinked_) {
    ::shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

void HostIpcMemory::release() {
  exported();
  for (Mapping& m : peers_) ::munmap(m.base, m.bytes);
  peers_.clear();
  if (own_.base) ::munmap(own_.base, own_.bytes);
  own_ = {nullptr, 0};
}

void HostIpcMemory::copy(char* dst, const char* src, size_t nbytes) {
  if (nbytes && dst != src) std::memmove(dst, src, nbytes);
}

void HostIpcMemory::reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) {
  if (count) make_reducer(dtype, op).fn(dst, a, b, count);
}

void HostIpcMemory::divide(DataType dtype, char* buf, size_t count, int divisor) {
  if (count) make_reducer(dtype, ReduceOp::kAvg).divide(buf, count, divisor);
}

void HostIpcMemory::transfers(const std::vector<IpcTransfer>& ts, const IpcBounds& b) {
  std::vector<char> done(ts.size(), 0);
  size_t left = ts.size();
  Backoff backoff(b);
  std::vector<const uint64_t*> blocked;  // post flags of transfers still pending (later ones keep their order)
  while (left) {
    bool progressed = false;
    int waiting_for = -1;
    blocked.clear();
    for (size_t i = 0; i < ts.size(); ++i) {
      if (done[i]) continue;
      const IpcTransfer& t = ts[i];
      bool ready = t.wait.at_least == 0 || load(t.wait.flag) >= t.wait.at_least;
      if (ready && t.post.flag) {
        for (const uint64_t* f : blocked) {
          if (f == t.post.flag) ready = false;
        }
      }
      if (!ready) {
        if (t.post.flag) blocked.push_back(t.post.flag);
        if (waiting_for < 0) waiting_for = t.wait.peer;
        continue;
      }
      backoff.check(t.wait);
      if (t.nbytes) std::memcpy(t.dst, t.src, t.nbytes);
      if (t.stamp) __atomic_store_n(t.stamp, t.stamp_value, __ATOMIC_RELAXED);
      if (t.post.flag) __atomic_store_n(t.post.flag, t.post.value, __ATOMIC_RELEASE);
      done[i] = 1;
      --left;
      progressed = true;
    }
    if (!progressed) backoff.pause(waiting_for);
  }
}

void HostIpcMemory::wait_all(const std::vector<IpcWait>& ws, const IpcBounds& b) {
  Backoff backoff(b);
  for (const IpcWait& w : ws) {
    while (load(w.flag) < w.at_least) backoff.pause(w.peer);
    backoff.check(w);
  }
}

void HostIpcMemory::post_all(const std::vector<IpcPost>& ps) {
  for (const IpcPost& p : ps) __atomic_store_n(p.flag, p.value, __ATOMIC_RELEASE);
}

void HostIpcMemory::set_words(const std::vector<uint64_t*>& words, uint64_t value) {
  for (uint64_t* w : words) {
    uint64_t expected = 0;
    __atomic_compare_exchange_n(w, &expected, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  }
}

uint64_t HostIpcMemory::read_word(const uint64_t* word) { return load(word); }

void HostIpcMemory::read_bytes(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }

void HostIpcMemory::write_bytes(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }

}  // namespace ringcomm
