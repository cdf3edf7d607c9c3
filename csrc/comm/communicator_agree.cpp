// The agreement of rooted calls: before a broadcast, reduce, scatter or
// gather moves data, every rank learns whether all ranks issued the same call.
#include "comm/communicator.h"

#include <cmath>

#include "algo/schedules.h"
#include "ringcomm/reducer.h"

namespace ringcomm {

// Rooted schedules do not make every rank hear from every other (a chain
// broadcast's root hears from nobody), so ranks that disagree on the root
// could all return "successfully" with different data. Before a rooted
// call's data moves, the ranks run the dissemination barrier carrying each
// rank's call (a 39-bit hash of its header: kind, dtype, op, family, root,
// seq, count) and its rank, folded by minimum: two words, the smallest hash
// with its rank and the largest (complemented) with its. After ceil(log2 n)
// rounds every rank holds the same two words, so either every rank goes on
// or every rank raises, naming two ranks whose calls differ. Each message's
// header is also checked against the receiver's call (executor), so the
// ranks next to a disagreeing one raise at once with both calls described,
// and tell the others. log2 n peers a rank, the barrier's: not the full mesh
// of connections that checking every pair would open (docs/errors.md).
void Communicator::agree_on_call(const Call& c, Clock::time_point deadline, const CallInfo& info) {
  if (world_ == 1) return;
  const MsgTag& t = c.tag;
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (uint64_t x : {uint64_t(t.kind), uint64_t(t.dtype), uint64_t(t.redop), uint64_t(t.algo),
                     uint64_t(uint32_t(t.root)), t.seq, t.count}) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  // Ranks below 2^24, the hash in the 39 bits above: the words stay below
  // 2^63, so the int64 minimum the run reduces with orders them as unsigned.
  constexpr int kRankBits = 24;
  constexpr uint64_t kRankMask = (1ull << kRankBits) - 1, kHashMask = (1ull << (63 - kRankBits)) - 1;
  h &= kHashMask;
  const uint64_t me = static_cast<uint64_t>(rank_) & kRankMask;
  const int64_t* w = agree_minimum(static_cast<int64_t>((h << kRankBits) | me),
                                   static_cast<int64_t>(((~h & kHashMask) << kRankBits) | me), c.tag, deadline, info);
  const uint64_t got[2] = {static_cast<uint64_t>(w[0]), static_cast<uint64_t>(w[1])};
  const uint64_t lo = got[0] >> kRankBits, hi = ~(got[1] >> kRankBits) & kHashMask;
  if (lo != hi) {
    throw MismatchError("ringcomm: mismatched calls: ranks " + std::to_string(got[0] & kRankMask) + " and " +
                        std::to_string(got[1] & kRankMask) + " issued different calls where rank " +
                        std::to_string(rank_) + " is in " + describe_tag(c.tag) +
                        " (the root, count, dtype, op or algorithm differ); all ranks must issue the same "
                        "collectives in the same order");
  }
}

const int64_t* Communicator::agree_minimum(int64_t w0, int64_t w1, const MsgTag& tag, Clock::time_point deadline,
                                           const CallInfo& info) {
  agreement_state_[0] = static_cast<uint64_t>(w0);
  agreement_state_[1] = static_cast<uint64_t>(w1);
  if (agreement_schedule_.empty()) {
    PlanContext ctx{rank_, world_, sizeof(uint64_t), 1, &agreement_schedule_};
    agreement_result_ = dissemination_agreement(ctx, {kState, 0});
    agreement_flat_ = Executor::flat_shape(agreement_schedule_);
  }
  PlanBuffers bufs;
  bufs.base[kState] = reinterpret_cast<char*>(agreement_state_);
  static const Reducer minimum = make_reducer(DataType::kInt64, ReduceOp::kMin);
  executor_.run(agreement_schedule_, bufs, tag, &minimum, deadline, info, nullptr, &agreement_flat_);
  return reinterpret_cast<const int64_t*>(agreement_state_ + agreement_result_.offset / sizeof(uint64_t));
}

// The tuner (comm/autotune.h) samples every call it tunes and, when a
// window completes, has the ranks agree on the slowest rank's median: the
// same rounds as above, inside the call that completed it, so every rank
// changes its pick between the same two calls.
void Communicator::tune_after(const Call& c, Clock::time_point start, Clock::time_point deadline,
                              const CallInfo& info) {
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  int64_t word = 0;
  const bool agree = tuner_.record(c.kind, c.model_bytes, secs, &word, [&] {
    ChoiceCall call;
    call.kind = c.kind;
    call.bytes = c.model_bytes;
    std::vector<Candidate> out;
    for (const Candidate& k : candidates(choice_context(c.kind), call)) {
      // What the model can run for it, and the unmodelled pulls of large calls.
      if (std::isfinite(k.seconds) || k.algo == Algo::kPull) out.push_back(k);
    }
    return out;
  });
  if (!agree) return;
  const int64_t* got = agree_minimum(word, 0, c.tag, deadline, info);
  if (tuner_.agreed(c.kind, c.model_bytes, got[0])) {
    plan_cache_.forget_memos();  // a memo of this signature's plan (queued copies too) asks again
    memo_.valid = false;
    check_memo_.call.plan = nullptr;
  }
}

}  // namespace ringcomm
