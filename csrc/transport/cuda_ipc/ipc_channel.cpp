#include "transport/cuda_ipc/ipc_channel.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace ringcomm {

namespace {

constexpr uint64_t kIpcMagic = 0x72636970633031ULL;  // "rcipc01"
constexpr size_t kPageBytes = 4096;
constexpr size_t kFlagStride = 64;  // one flag per cache line
enum FlagKind { kReady = 0, kFreed = 1, kStaged = 2, kReduced = 3, kDone = 4, kNumFlagKinds = 5 };

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

// Shard i of `count` elements over n ranks: the ring's block partition
// (algo/blocks.h ring_block), so two-shot shards are the ring's blocks.
void shard(size_t count, int n, int i, size_t* offset, size_t* len) {
  const size_t base = count / n, extra = count % n, ui = static_cast<size_t>(i);
  *offset = ui * base + std::min(ui, extra);
  *len = base + (ui < extra ? 1 : 0);
}

size_t flags_bytes(int world) { return round_up(kNumFlagKinds * world * kFlagStride, kPageBytes); }

// A slot: a 64-byte stamp (the bytes left in the message from this chunk on,
// checked by the receiver), then the data.
constexpr size_t kStampBytes = 64;
size_t slot_stride(size_t slot_bytes) { return kStampBytes + slot_bytes; }

}  // namespace

struct IpcChannel::Header {
  uint64_t magic;
  uint32_t world;
  uint32_t rank;
  uint64_t slot_bytes;
  uint64_t nslots;
  uint64_t stage_bytes;
  int64_t pid;
  alignas(64) uint64_t abort;
  alignas(64) uint64_t staged_bytes;  // the size of the owner's staged input (checked by the readers)
  alignas(64) char reason[512];
};


IpcChannel::Header* IpcChannel::header(int r) const {
  static_assert(sizeof(Header) <= kPageBytes, "the header fits its page");
  return reinterpret_cast<Header*>(base_[r]);
}

size_t IpcChannel::buffer_bytes(int world, const IpcGeometry& g) {
  return kPageBytes + flags_bytes(world) + round_up(world * g.nslots * slot_stride(g.slot_bytes), kPageBytes) +
         2 * round_up(g.stage_bytes, kPageBytes);
}

IpcChannel::IpcChannel(int rank, int world, IpcGeometry geometry, double timeout_s,
                       std::unique_ptr<IpcMemory> memory)
    : rank_(rank),
      world_(world),
      geo_(geometry),
      timeout_s_(timeout_s),
      mem_(std::move(memory)),
      base_(world, nullptr),
      pids_(world, 0),
      sent_(world, 0),
      received_(world, 0) {
  if (world < 1 || rank < 0 || rank >= world) throw ValueError("cuda_ipc: rank out of range");
  if (geo_.slot_bytes < 64 || geo_.slot_bytes % 64 || geo_.nslots < 1 || geo_.stage_bytes % 64) {
    throw ValueError("cuda_ipc: slots must be multiples of 64 bytes, at least one, and the stage a multiple of 64");
  }
  if (timeout_s_ <= 0) throw ValueError("cuda_ipc: the timeout must be positive");
  bytes_ = buffer_bytes(world, geo_);
  base_[rank_] = mem_->allocate(bytes_);
  Header h{};
  h.magic = kIpcMagic;
  h.world = static_cast<uint32_t>(world);
  h.rank = static_cast<uint32_t>(rank);
  h.slot_bytes = geo_.slot_bytes;
  h.nslots = static_cast<uint64_t>(geo_.nslots);
  h.stage_bytes = geo_.stage_bytes;
  h.pid = static_cast<int64_t>(::getpid());
  mem_->write_bytes(base_[rank_], &h, sizeof h);
  pids_[rank_] = h.pid;
  handle_ = mem_->export_handle();
}

IpcChannel::~IpcChannel() {
  try {
    release();
  } catch (...) {
  }
}

void IpcChannel::connect(const std::vector<std::string>& handles) {
  if (static_cast<int>(handles.size()) != world_) {
    throw ValueError("cuda_ipc: connect needs one handle per rank, got " + std::to_string(handles.size()));
  }
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    base_[r] = mem_->open_peer(r, handles[r], bytes_);
    Header h{};
    mem_->read_bytes(&h, base_[r], sizeof h);
    if (h.magic != kIpcMagic || h.world != static_cast<uint32_t>(world_) || h.rank != static_cast<uint32_t>(r) ||
        h.slot_bytes != geo_.slot_bytes || h.nslots != static_cast<uint64_t>(geo_.nslots) ||
        h.stage_bytes != geo_.stage_bytes) {
      throw Error("cuda_ipc: rank " + std::to_string(r) + "'s buffer has another geometry (world " +
                  std::to_string(h.world) + ", rank " + std::to_string(h.rank) + ", slots " +
                  std::to_string(h.nslots) + " x " + std::to_string(h.slot_bytes) + " B, stage " +
                  std::to_string(h.stage_bytes) + " B) than this rank's (world " + std::to_string(world_) +
                  ", slots " + std::to_string(geo_.nslots) + " x " + std::to_string(geo_.slot_bytes) + " B, stage " +
                  std::to_string(geo_.stage_bytes) + " B): do all ranks use the same settings?");
    }
    pids_[r] = h.pid;
  }
  connected_ = true;
}

void IpcChannel::exported() { mem_->exported(); }


uint64_t* IpcChannel::flag(int owner, int kind, int writer) const {
  return reinterpret_cast<uint64_t*>(base_[owner] + kPageBytes + (kind * world_ + writer) * kFlagStride);
}

char* IpcChannel::slot(int owner, int from, uint64_t k) const {
  const uint64_t i = (k - 1) % static_cast<uint64_t>(geo_.nslots);
  return base_[owner] + kPageBytes + flags_bytes(world_) +
         (static_cast<size_t>(from) * geo_.nslots + i) * slot_stride(geo_.slot_bytes) + kStampBytes;
}

uint64_t* IpcChannel::stamp(int owner, int from, uint64_t k) const {
  return reinterpret_cast<uint64_t*>(slot(owner, from, k) - kStampBytes);
}

char* IpcChannel::stage(int owner) const {
  return base_[owner] + kPageBytes + flags_bytes(world_) +
         round_up(world_ * geo_.nslots * slot_stride(geo_.slot_bytes), kPageBytes);
}

char* IpcChannel::result(int owner) const { return stage(owner) + round_up(geo_.stage_bytes, kPageBytes); }

void IpcChannel::begin(const char* what, uint64_t seq) {
  what_ = what;
  seq_ = seq;
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s_));
}

IpcBounds IpcChannel::bounds() const {
  IpcBounds b;
  b.abort_word = &header(rank_)->abort;
  for (int r = 0; r < world_; ++r) b.peer_abort_words.push_back(&header(r)->abort);
  b.rank = rank_;
  b.deadline = deadline_;
  b.timeout_s = timeout_s_;
  b.peer_pids = pids_.data();
  b.what = what_;
  b.seq = seq_;
  return b;
}

// Runs one protocol step; a failure the memory raised has already set every
// rank's abort word (IpcMemory::transfers), so it only needs its message.
template <class F>
void IpcChannel::guarded(F&& f) {
  if (!connected_ || released_) throw Error("cuda_ipc: the channel is not connected (or released)");
  try {
    f();
  } catch (const IpcWaitFailed& e) {
    const std::string msg = std::string("ringcomm: ") + what_ + " (call " + std::to_string(seq_) + ") on rank " +
                            std::to_string(rank_) + " over cuda_ipc failed: " + describe(e.word);
    if (ipc_abort_kind(e.word) == IpcAbortKind::kTimeout) throw TimeoutError(msg);
    if (ipc_abort_kind(e.word) == IpcAbortKind::kPeerDied) throw PeerLostError(msg);
    if (ipc_abort_kind(e.word) == IpcAbortKind::kMismatch) throw MismatchError(msg);
    throw Error(msg);
  }
}

void IpcChannel::group(const std::vector<IpcP2p>& ops) {
  guarded([&] {
    for (const IpcP2p& p : ops) {  // before any chunk is counted
      if (p.peer < 0 || p.peer >= world_ || p.peer == rank_) {
        throw ValueError("cuda_ipc: peer " + std::to_string(p.peer) + " is not another rank of " +
                         std::to_string(world_));
      }
    }
    std::vector<IpcTransfer> ts;
    ts.reserve(ops.size());
    for (const IpcP2p& p : ops) {
      for (size_t off = 0; off < p.nbytes || (off == 0 && p.nbytes == 0); off += geo_.slot_bytes) {
        const size_t n = std::min(geo_.slot_bytes, p.nbytes - off);
        IpcTransfer t;
        if (p.send) {
          const uint64_t k = ++sent_[p.peer];
          const uint64_t nslots = static_cast<uint64_t>(geo_.nslots);
          t.wait = {flag(rank_, kFreed, p.peer), k > nslots ? k - nslots : 0, p.peer};
          t.dst = slot(p.peer, rank_, k);
          t.src = p.ptr + off;
          t.post = {flag(p.peer, kReady, rank_), k};
          t.stamp = stamp(p.peer, rank_, k);
          t.stamp_value = p.nbytes - off;
        } else {
          const uint64_t k = ++received_[p.peer];
          t.wait = {flag(rank_, kReady, p.peer), k, p.peer, stamp(rank_, p.peer, k), p.nbytes - off};
          t.dst = p.ptr + off;
          t.src = slot(rank_, p.peer, k);
          t.post = {flag(p.peer, kFreed, rank_), k};
        }
        t.nbytes = n;
        ts.push_back(t);
        if (p.nbytes == 0) break;
      }
    }
    if (!ts.empty()) mem_->transfers(ts, bounds());
  });
}

void IpcChannel::stage_input(const char* in, size_t nbytes) {
  const uint64_t c = ++collective_;
  std::vector<IpcWait> free_stage;
  for (int d = 0; d < world_; ++d) {
    if (d != rank_ && c > 1) free_stage.push_back({flag(rank_, kDone, d), c - 1, d});
  }
  const IpcBounds b = bounds();
  if (!free_stage.empty()) mem_->wait_all(free_stage, b);
  if (nbytes) mem_->copy(stage(rank_), in, nbytes);
  // The size first, then the flags (post_all posts in order).
  std::vector<IpcPost> posts{{&header(rank_)->staged_bytes, nbytes}};
  for (int r = 0; r < world_; ++r) posts.push_back({flag(r, kStaged, rank_), c});
  mem_->post_all(posts);
  std::vector<IpcWait> staged;
  for (int s = 0; s < world_; ++s) {
    if (s != rank_) staged.push_back({flag(rank_, kStaged, s), c, s, &header(s)->staged_bytes, nbytes});
  }
  if (!staged.empty()) mem_->wait_all(staged, b);
}

void IpcChannel::finish_collective() {
  std::vector<IpcPost> posts;
  for (int r = 0; r < world_; ++r) posts.push_back({flag(r, kDone, rank_), collective_});
  mem_->post_all(posts);
}

void IpcChannel::one_shot_all_reduce(DataType dtype, ReduceOp op, char* out, const char* in, size_t count) {
  guarded([&] {
    const size_t elem = dtype_size(dtype), nbytes = count * elem;
    if (nbytes > geo_.stage_bytes) {
      throw ValueError("cuda_ipc: one-shot all_reduce of " + std::to_string(nbytes) + " bytes exceeds the stage of " +
                       std::to_string(geo_.stage_bytes));
    }
    stage_input(in, nbytes);
    const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    if (count) {
      // Rank order on every rank: ((x0 op x1) op x2) ...
      if (world_ == 1) {
        mem_->copy(out, stage(0), nbytes);
      } else {
        mem_->reduce(dtype, combine, out, stage(0), stage(1), count);
        for (int s = 2; s < world_; ++s) mem_->reduce(dtype, combine, out, out, stage(s), count);
      }
      if (op == ReduceOp::kAvg) mem_->divide(dtype, out, count, world_);
    }
    finish_collective();
  });
}

void IpcChannel::two_shot_all_reduce(DataType dtype, ReduceOp op, char* out, const char* in, size_t count) {
  guarded([&] {
    const size_t elem = dtype_size(dtype), nbytes = count * elem;
    if (nbytes > geo_.stage_bytes) {
      throw ValueError("cuda_ipc: two-shot all_reduce of " + std::to_string(nbytes) + " bytes exceeds the stage of " +
                       std::to_string(geo_.stage_bytes));
    }
    stage_input(in, nbytes);
    const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    size_t off, len;
    shard(count, world_, rank_, &off, &len);
    if (len) {
      char* mine = result(rank_) + off * elem;
      if (world_ == 1) {
        mem_->copy(mine, stage(0) + off * elem, len * elem);
      } else {
        mem_->reduce(dtype, combine, mine, stage(0) + off * elem, stage(1) + off * elem, len);
        for (int s = 2; s < world_; ++s) mem_->reduce(dtype, combine, mine, mine, stage(s) + off * elem, len);
      }
      if (op == ReduceOp::kAvg) mem_->divide(dtype, mine, len, world_);
    }
    std::vector<IpcPost> posts;
    for (int r = 0; r < world_; ++r) posts.push_back({flag(r, kReduced, rank_), collective_});
    mem_->post_all(posts);
    // Each shard once its owner posted it: transfers progress together, so
    // the copy of a shard that is ready does not wait for a slower one.
    std::vector<IpcTransfer> gather;
    for (int s = 0; s < world_; ++s) {
      size_t so, sl;
      shard(count, world_, s, &so, &sl);
      IpcTransfer t;
      t.wait = {flag(rank_, kReduced, s), s == rank_ ? 0 : collective_, s};
      t.dst = out + so * elem;
      t.src = result(s) + so * elem;
      t.nbytes = sl * elem;
      t.post = {nullptr, 0};
      gather.push_back(t);
    }
    mem_->transfers(gather, bounds());
    finish_collective();
  });
}

std::string IpcChannel::describe(uint64_t word) {
  const int who = ipc_abort_rank(word), peer = ipc_abort_peer(word);
  std::string text;
  switch (ipc_abort_kind(word)) {
    case IpcAbortKind::kTimeout:
      text = "rank " + std::to_string(who) + " timed out after " + std::to_string(timeout_s_) +
             " s waiting for rank " + std::to_string(peer);
      break;
    case IpcAbortKind::kMismatch:
      text = "rank " + std::to_string(who) + " received from rank " + std::to_string(peer) +
             " data of another size than it expected: the ranks called different collectives, sizes or peers";
      break;
    case IpcAbortKind::kPeerDied:
      text = "rank " + std::to_string(who) + " found rank " + std::to_string(peer) + " dead (its process is gone)";
      break;
    default: {
      text = "rank " + std::to_string(who) + " failed or aborted";
      if (who >= 0 && who < world_ && base_[who]) {
        char reason[512] = {};
        try {
          mem_->read_bytes(reason, header(who)->reason, sizeof reason - 1);
        } catch (...) {
        }
        reason[sizeof reason - 1] = 0;
        if (reason[0]) text += std::string(": ") + reason;
      }
    }
  }
  return text;
}

void IpcChannel::abort(const std::string& why, IpcAbortKind kind, int peer) {
  std::lock_guard<std::mutex> lk(abort_mu_);
  if (released_ || !base_[rank_]) return;
  if (mem_->read_word(&header(rank_)->abort) != 0) return;  // failed already: the first word stays
  char reason[512] = {};
  std::strncpy(reason, why.c_str(), sizeof reason - 1);
  mem_->write_bytes(header(rank_)->reason, reason, sizeof reason);
  std::vector<uint64_t*> words;
  for (int r = 0; r < world_; ++r) {
    if (base_[r]) words.push_back(&header(r)->abort);
  }
  mem_->set_words(words, ipc_abort_word(kind, rank_, peer));
}

std::string IpcChannel::failure() {
  std::lock_guard<std::mutex> lk(abort_mu_);
  if (released_ || !base_[rank_]) return "";
  uint64_t w = mem_->read_word(&header(rank_)->abort);
  if (w == 0) {
    // A device wait failed and (from the kernel) set the words already; the
    // host learns it here.
    w = mem_->failure();
  }
  return w ? describe(w) : "";
}

bool IpcChannel::failure_is_timeout() {
  std::lock_guard<std::mutex> lk(abort_mu_);
  if (released_ || !base_[rank_]) return false;
  uint64_t w = mem_->read_word(&header(rank_)->abort);
  if (w == 0) w = mem_->failure();
  return ipc_abort_kind(w) == IpcAbortKind::kTimeout;
}

void IpcChannel::release() {
  std::lock_guard<std::mutex> lk(abort_mu_);
  if (released_) return;
  released_ = true;
  mem_->release();
  std::fill(base_.begin(), base_.end(), nullptr);
}

}  // namespace ringcomm
