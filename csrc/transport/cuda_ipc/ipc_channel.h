// The cuda_ipc transport's protocol: point-to-point groups, one-shot and
// two-shot all-reduce, errors and teardown, over IPC-mapped buffers of the
// ranks of one host. Written once against IpcMemory (ipc_memory.h): the CUDA
// implementation runs it on GPUs (several ranks may share one GPU, which NCCL
// refuses), the host shared-memory one runs it in CPU tests between real
// processes.
//
// Buffer layout (each rank allocates one buffer at init, exports its handle
// through the store, and maps every peer's buffer once; nothing is allocated
// or registered per call, which is also what CUDA graphs would need):
//
//   header    one page: magic, geometry, owner pid, the abort word, the size
//             of the staged input, the abort reason (text written by the
//             rank that failed)
//   flags     5 x world 64-bit counters, one per 64-byte line, indexed by
//             the rank that writes them:
//               ready[s]    chunks s has put into this rank's inbox from s
//               freed[d]    chunks of this rank's that d has taken out of
//                           d's inbox from this rank (slots free again)
//               staged[s]   the collective call whose input s has staged
//               reduced[s]  the two-shot call whose shard s has reduced
//               done[s]     the collective call s has finished reading in
//                           every buffer
//   inbox     world x nslots slots: a 64-byte stamp, then slot_bytes of
//             data; slot i of row s holds chunk k of s's messages to this
//             rank, i = (k - 1) mod nslots
//   stage     stage_bytes: this rank's input of a one-/two-shot all-reduce
//   result    stage_bytes: the shards this rank reduced (two-shot)
//
// Every wait reads a flag of the waiter's own buffer and every post writes a
// peer's (or its own) buffer: on a GPU the spin stays in local memory and
// only the posts cross the link.
//
// Point-to-point (the verbs of the schedules in csrc/algo, driven by the
// device executor as groups): chunk k from s to d (k counts s's chunks to d,
// from 1; both sides count the same way because transfers between a pair
// match in the order they were posted, as in NCCL):
//   s: wait freed[d] >= k - nslots (own buffer), copy into d's inbox slot,
//      stamp it with the bytes left in the message from this chunk on, post
//      ready[s] = k in d's buffer;
//   d: wait ready[s] >= k (own buffer), check the stamp against the bytes it
//      expects (ranks that called different sizes or collectives fail with a
//      mismatch instead of taking wrong data), copy the slot out, post
//      freed[d] = k in s's buffer.
// The transfers of one group progress together, so a group may hold up to
// nslots chunks to each peer beside its receives without deadlock.
//
// One-shot all-reduce (call c counts the one-/two-shot calls, from 1):
//   wait done[d] >= c - 1 for all d (peers finished reading this rank's stage
//   of the last call); copy the input into the stage; write its size into
//   this rank's header, then post staged[me] = c in every buffer; wait
//   staged[s] >= c for all s and check each s's size against this rank's; reduce the n stages in rank
//   order 0, 1, ..., n - 1 into the output ((x0 op x1) op x2 ...: the same
//   bits on every rank); post done[me] = c everywhere.
// Two-shot (reduce-scatter, then all-gather, through the same buffers):
//   stage as above; rank r reduces shard r of every stage (rank order) into
//   its result area and posts reduced[r] = c everywhere; then every rank
//   copies shard s out of rank s's result area, once reduced[s] >= c; then
//   done[me] = c everywhere. Shards are the block partition of the ring
//   (algo/blocks.h): one-shot and two-shot give the same bits.
//
// Errors: a wait past the deadline, one that finds its abort word set, or a
// stamp that does not match, fails. The failing rank writes an abort word (kind, its rank, the peer it
// waited for) into every rank's header, so every other rank's next (or
// current) wait fails at once instead of at its own deadline: a dead peer
// (kill -9) makes the first waiter time out and all others follow within the
// deadline; abort() from another thread sets the words the same way. Work
// queued behind a failed wait sees the word and does nothing. After an error
// the channel only releases.
//
// Release: close() and abort() unmap the peers' buffers and free this rank's;
// the host implementation's name leaves /dev/shm as soon as all peers have
// mapped it (exported()), so neither a crash nor an abort leaves a name
// behind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/cuda_ipc/ipc_memory.h"

namespace ringcomm {

// One transfer of a point-to-point group (comm/device_executor.h P2pOp, seen
// from the transport).
struct IpcP2p {
  bool send;
  char* ptr;
  size_t nbytes;
  int peer;
};

struct IpcGeometry {
  size_t slot_bytes = 1 << 20;  // the most one chunk moves (the executor's chunk size)
  int nslots = 4;
  size_t stage_bytes = 1 << 20;  // the largest one-/two-shot all-reduce
};

class IpcChannel {
 public:
  IpcChannel(int rank, int world, IpcGeometry geometry, double timeout_s, std::unique_ptr<IpcMemory> memory);
  ~IpcChannel();
  IpcChannel(const IpcChannel&) = delete;
  IpcChannel& operator=(const IpcChannel&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  const IpcGeometry& geometry() const { return geo_; }
  IpcMemory& memory() { return *mem_; }
  static size_t buffer_bytes(int world, const IpcGeometry& g);

  // Init, in this order, on every rank: handle() goes through the store;
  // connect() maps the peers' buffers (checks their headers); once every rank
  // has connected (a barrier through the store), exported().
  std::string handle() const { return handle_; }
  void connect(const std::vector<std::string>& handles);
  void exported();

  // Operation context for messages and deadlines: set before each call.
  void begin(const char* what, uint64_t seq);

  // A point-to-point group (transfers bigger than a slot are cut into chunks).
  void group(const std::vector<IpcP2p>& ops);
  // In place when out == in. count * elem <= stage_bytes.
  void one_shot_all_reduce(DataType dtype, ReduceOp op, char* out, const char* in, size_t count);
  void two_shot_all_reduce(DataType dtype, ReduceOp op, char* out, const char* in, size_t count);

  // Records `why` and sets every rank's abort word (any thread; idempotent).
  void abort(const std::string& why, IpcAbortKind kind = IpcAbortKind::kError, int peer = -1);
  // The failure that stopped the protocol, as text naming who failed and why
  // ("" when none): this rank's abort word, or a failure a queued device wait
  // recorded (which it then spreads to the peers).
  std::string failure();
  bool failure_is_timeout();
  // Unmaps and frees (idempotent; never waits for a peer).
  void release();

 private:
  struct Header;
  Header* header(int r) const;
  uint64_t* flag(int owner, int kind, int writer) const;
  char* slot(int owner, int from, uint64_t k) const;
  uint64_t* stamp(int owner, int from, uint64_t k) const;
  char* stage(int owner) const;
  char* result(int owner) const;
  IpcBounds bounds() const;
  std::string describe(uint64_t word);
  void stage_input(const char* in, size_t nbytes);
  void finish_collective();
  template <class F>
  void guarded(F&& f);

  int rank_;
  int world_;
  IpcGeometry geo_;
  double timeout_s_;
  std::unique_ptr<IpcMemory> mem_;
  size_t bytes_;
  std::string handle_;
  std::vector<char*> base_;  // by rank: this rank's buffer and the mapped peers'
  std::vector<int64_t> pids_;
  std::vector<uint64_t> sent_, received_;  // chunks to / from each peer
  uint64_t collective_ = 0;                // one-/two-shot calls
  const char* what_ = "";
  uint64_t seq_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::mutex abort_mu_;  // abort() from another thread against release()
  bool released_ = false;
  bool connected_ = false;
};

}  // namespace ringcomm
