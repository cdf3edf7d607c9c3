// The latency path of small synchronous all_reduce calls (send/recv run
// inline through the matcher: comm/p2p_match.cpp).
//
// all_reduce runs the one-shot schedule (algo/direct.cpp: every rank sends its input
// to every peer and folds all inputs in rank order, so every rank gets the
// same bits) directly on the links: no Call, Schedule, Work or queue entry,
// one lock, peers' inputs reduced where they lie in this rank's inbox. Its
// messages are exactly those of the one-shot schedule for a message of one
// segment, so a rank on this path and a rank on the general path (one that
// has asynchronous calls queued, say) run the same call together.
#include <algorithm>
#include <cstring>

#include "comm/communicator.h"

namespace ringcomm {

template <class Number>
bool Communicator::claim_inline(Number&& number) {
  std::lock_guard<std::mutex> lk(mu_);
  check_usable();
  if (!queue_.empty() || running_) return false;  // keep issue order: queue behind them
  check_thread("a call");
  running_ = true;
  running_name_ = "a small synchronous call";
  number();
  return true;
}

template <class Body>
void Communicator::run_claimed(Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    fail(e.what());
    release_inline();
    throw;
  }
  release_inline();
}

bool Communicator::small_all_reduce(const Buffer& x, ReduceOp op, const Reducer& reducer) {
  if (!small_path_ || x.nbytes() > small_max_bytes_) return false;
  MsgTag tag;
  if (!claim_inline([&] { tag.seq = ++seq_; })) return false;
  CallRecordView rec;
  rec.kind = static_cast<uint8_t>(OpKind::kAllReduce);
  rec.state = static_cast<uint8_t>(CallState::kRunning);
  rec.seq = tag.seq;
  router_.record_call(rec);
  tag.kind = static_cast<uint8_t>(OpKind::kAllReduce);
  tag.dtype = static_cast<uint8_t>(x.dtype);
  tag.redop = static_cast<uint8_t>(op);
  tag.algo = kFamilyOneShot;
  tag.root = -1;
  tag.count = x.count;
  try {
    run_claimed([&] { run_small_all_reduce(x, tag, reducer, op == ReduceOp::kAvg); });
  } catch (...) {
    rec.state = static_cast<uint8_t>(CallState::kFailed);
    router_.record_call(rec);
    throw;
  }
  rec.state = static_cast<uint8_t>(CallState::kFinished);
  router_.record_call(rec);
  return true;
}

void Communicator::run_small_all_reduce(const Buffer& x, const MsgTag& tag, const Reducer& reducer,
                                        bool avg) {
  const int n = world_, r = rank_;
  if (n == 1) return;  // the sum (or AVG) of one input is the input
  const size_t bytes = x.nbytes();
  const uint32_t offset = page_offset(x.ptr);
  std::fill(small_in_.begin(), small_in_.end(), nullptr);
  int sent = 0, got = 0;
  // Sends go to r+1, r+2, ... as in the schedule; receives are taken from
  // whichever peer's input has arrived.
  auto step = [&] {
    bool moved = false;
    while (sent < n - 1) {
      const int p = (r + 1 + sent) % n;
      Link* link = router_.link(p);
      char* slot = link->send_slot(offset);
      if (!slot) break;
      if (bytes) std::memcpy(slot, x.ptr, bytes);
      MsgHeader h;
      h.tag = tag;
      h.nbytes = static_cast<uint32_t>(bytes);
      h.segment = 0;
      link->send_commit(h);
      ++sent;
      moved = true;
    }
    for (int i = 1; i < n && got < n - 1; ++i) {
      const int p = (r - i + n) % n;
      if (small_in_[p]) continue;
      const char* payload = nullptr;
      const MsgHeader* h = router_.link(p)->recv_peek(&payload);
      if (!h || executor_.absorbed_p2p(tag, p, *h, &moved)) continue;
      executor_.check_header(tag, p, 0, *h, bytes);
      small_in_[p] = payload;
      ++got;
      moved = true;
    }
    return moved;
  };
  CallInfo info{"all_reduce", tag.seq, r, config_.timeout_s};
  info.kind = static_cast<int>(OpKind::kAllReduce);
  auto timeout = [&] {
    std::string what;
    if (sent < n - 1) {
      what = "waiting for rank " + std::to_string((r + 1 + sent) % n) + " to take data";
    } else {
      for (int i = 1; i < n; ++i) {
        const int p = (r - i + n) % n;
        if (!small_in_[p]) {
          what = "waiting for data from rank " + std::to_string(p);
          break;
        }
      }
    }
    executor_.throw_timeout(info, what);
  };
  executor_.drive(step, [&] { return sent == n - 1 && got == n - 1; }, deadline_from_now(), info, timeout);

  // Fold inputs 0..n-1 in rank order into x. Ranks 0 and 1 read their own
  // input (x) at the first fold, before anything is written; later ranks
  // keep a copy of theirs.
  const char* own = x.ptr;
  if (r >= 2) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    std::memcpy(scratch_.data(), x.ptr, bytes);
    own = scratch_.data();
  }
  small_in_[r] = own;
  reducer.fn(x.ptr, small_in_[0], small_in_[1], x.count);
  for (int p = 2; p < n; ++p) reducer.fn(x.ptr, x.ptr, small_in_[p], x.count);
  if (avg) reducer.divide(x.ptr, x.count, n);
  for (int i = 1; i < n; ++i) router_.link((r - i + n) % n)->recv_release();
}

}  // namespace ringcomm
