// The device-memory interface the cuda_ipc protocol (ipc_channel.h) is
// written against: a communication buffer that peers on the same host open
// through a handle, and a handful of operations queued in order (copies,
// reductions, flag waits and flag posts). Two implementations:
// - HostIpcMemory (host_ipc_memory.h): POSIX shared memory between real
//   processes, operations run at once on the calling thread. It is the CPU
//   stand-in that runs the protocol in tests on machines without a GPU.
// - CudaIpcMemory (cuda/cuda_ipc_memory.h): cudaMalloc + cudaIpcGetMemHandle /
//   cudaIpcOpenMemHandle, operations queued on a CUDA stream, flag waits in
//   kernels whose spin is bounded by the deadline.
// Only the second needs a GPU to check.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ringcomm/types.h"

namespace ringcomm {

// "Wait until *flag >= at_least". Flags are 64-bit counters that only grow,
// so a wait never misses a post and never wraps.
struct IpcWait {
  const uint64_t* flag;
  uint64_t at_least;
  int peer;  // the rank that posts it (named by a timeout)
  // Once the flag is reached, *check must equal check_value (nullptr: no
  // check): the size the peer stamped beside its data, so that ranks that
  // called different sizes or collectives fail instead of exchanging wrong data.
  const uint64_t* check = nullptr;
  uint64_t check_value = 0;
};

// "*flag = value" (release: what was written before it is visible first).
struct IpcPost {
  uint64_t* flag;
  uint64_t value;
};

// Wait, copy `nbytes` from src to dst, stamp, post. A transfer whose wait
// has at_least == 0 does not wait; one with no stamp writes none.
struct IpcTransfer {
  IpcWait wait;
  char* dst;
  const char* src;
  size_t nbytes;
  IpcPost post;
  uint64_t* stamp = nullptr;  // written after the data, before the post
  uint64_t stamp_value = 0;
};

// Abort words: 0 while healthy; otherwise who failed and why, so every rank
// can name the first failure (ipc_channel.h, "Errors").
enum class IpcAbortKind : uint8_t { kNone = 0, kTimeout = 1, kError = 2, kPeerDied = 3, kMismatch = 4 };
inline uint64_t ipc_abort_word(IpcAbortKind kind, int rank, int peer) {
  return static_cast<uint64_t>(kind) | (static_cast<uint64_t>(rank + 1) & 0xffffff) << 8 |
         static_cast<uint64_t>(peer + 1) << 32;
}
inline IpcAbortKind ipc_abort_kind(uint64_t w) { return static_cast<IpcAbortKind>(w & 0xff); }
inline int ipc_abort_rank(uint64_t w) { return static_cast<int>((w >> 8) & 0xffffff) - 1; }
inline int ipc_abort_peer(uint64_t w) { return static_cast<int>(w >> 32) - 1; }

// What bounds a wait: this rank's abort word (set by any rank that failed),
// the deadline, and the peers' abort words to set when this wait fails, so
// that the failure reaches every rank whether or not its host is watching.
struct IpcBounds {
  const uint64_t* abort_word = nullptr;
  std::vector<uint64_t*> peer_abort_words;  // this rank's own word included
  int rank = 0;
  std::chrono::steady_clock::time_point deadline;  // host waits
  double timeout_s = 0;                            // device waits: from the kernel's start
  const int64_t* peer_pids = nullptr;              // by rank, 0 when unknown (host liveness checks)
  const char* what = "";                           // the op, for messages
  uint64_t seq = 0;                                // its sequence number on the communicator
};

// Thrown by a host wait that failed (deadline, abort word, dead peer), after
// it set the peers' abort words; the channel turns `word` into the message.
class IpcWaitFailed : public Error {
 public:
  explicit IpcWaitFailed(uint64_t w) : Error("cuda_ipc: a wait failed"), word(w) {}
  uint64_t word;
};

class IpcMemory {
 public:
  virtual ~IpcMemory() = default;

  // This rank's communication buffer, zeroed, page aligned. Once.
  virtual char* allocate(size_t bytes) = 0;
  // The text peers open it by (it goes through the store).
  virtual std::string export_handle() = 0;
  // Maps rank `peer`'s buffer of `bytes`, given its handle.
  virtual char* open_peer(int peer, const std::string& handle, size_t bytes) = 0;
  // Every peer has opened this rank's buffer: a name can go (host: unlinked
  // from /dev/shm, so a crash leaves nothing behind).
  virtual void exported() = 0;
  // Unmaps the peers' buffers and frees this rank's (idempotent). Never
  // waits for a peer.
  virtual void release() = 0;

  // Scratch for the device executor (memory of the buffers' device).
  virtual char* alloc_scratch(size_t nbytes) = 0;
  virtual void free_scratch(char* p) = 0;

  // Queued operations, in issue order.
  virtual void copy(char* dst, const char* src, size_t nbytes) = 0;
  // dst = a (op) b; op is never AVG.
  virtual void reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) = 0;
  virtual void divide(DataType dtype, char* buf, size_t count, int divisor) = 0;
  // The transfers progress together (a group: none waits for one after it).
  // A wait that fails (deadline, abort word) stops the rest, sets the peers'
  // abort words and raises (host) or records the failure (device: the host
  // learns it from failure()); queued work after it then sees the abort word
  // and does nothing.
  virtual void transfers(const std::vector<IpcTransfer>& ts, const IpcBounds& b) = 0;
  virtual void wait_all(const std::vector<IpcWait>& ws, const IpcBounds& b) = 0;
  virtual void post_all(const std::vector<IpcPost>& ps) = 0;

  // From any thread, while operations are queued or running: sets the words
  // (the abort of a communicator).
  virtual void set_words(const std::vector<uint64_t*>& words, uint64_t value) = 0;
  // Reads a word of any mapped buffer now (not queued).
  virtual uint64_t read_word(const uint64_t* word) = 0;
  // Reads / writes bytes of a mapped buffer now (not queued): abort reasons.
  virtual void read_bytes(void* dst, const void* src, size_t n) = 0;
  virtual void write_bytes(void* dst, const void* src, size_t n) = 0;
  // A failure a queued wait recorded and nobody raised yet: (abort word, or
  // 0). Host waits raise at once, so theirs is always 0.
  virtual uint64_t failure() = 0;
};

}  // namespace ringcomm
