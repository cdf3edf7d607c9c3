// comm/executor.h FlatShape: which plans the executor runs flat, and which
// of their receives it holds (folds where the message lies) rather than
// copying out. A hold is only right when nothing but exact reads of the
// message touches its bytes; these cases pin both sides of that rule.
#include <cstddef>

#include "check.h"
#include "comm/call_plan.h"
#include "comm/executor.h"

using namespace ringcomm;

namespace {

constexpr size_t kElem = 4;

Schedule plan_of(OpKind kind, Algo algo, int rank, int world, size_t count) {
  Schedule steps;
  CallPlan call;
  call.kind = kind;
  call.count = count;
  call.algo = algo;
  call.out = BufRef{kOut, 0};
  PlanContext c{rank, world, kElem, 1024, &steps};
  plan_call(c, call);
  return steps;
}

Step transfer(StepKind kind, int peer, BufRef at, size_t nbytes) {
  Step s{};
  s.kind = kind;
  (kind == StepKind::kSend ? s.send_peer : s.recv_peer) = peer;
  (kind == StepKind::kSend ? s.src : s.dst) = at;
  s.nbytes = nbytes;
  return s;
}

Step local(StepKind kind, BufRef dst, BufRef src, BufRef src2, size_t nbytes) {
  Step s{};
  s.kind = kind;
  s.dst = dst;
  s.src = src;
  s.src2 = src2;
  s.nbytes = nbytes;
  return s;
}

const BufRef kScratch0{kScratch, 0};

}  // namespace

NATIVE_TEST(flat_shape, oneshot_folds_every_received_input_where_it_lies) {
  for (int n = 2; n <= 5; ++n) {
    for (int r = 0; r < n; ++r) {
      const Schedule steps = plan_of(OpKind::kAllReduce, Algo::kOneShot, r, n, 7);
      const FlatShape f = Executor::flat_shape(steps);
      CHECK_EQ(f.transfers, 2 * (n - 1));
      size_t reads_of_held = 0;
      for (int i = 0; i < f.transfers; ++i) {
        const bool recv = steps[i].kind == StepKind::kRecv;
        CHECK_EQ(((f.held >> i) & 1) != 0, recv);  // every receive held, no send
      }
      for (size_t j = static_cast<size_t>(f.transfers); j < steps.size(); ++j) {
        for (int k = 0; k < 2; ++k) {
          const int8_t from = f.from[j - f.transfers][k];
          if (from == FlatShape::kOwn) continue;
          const BufRef read = k == 0 ? steps[j].src : steps[j].src2;
          CHECK(read == steps[from].dst);
          ++reads_of_held;
        }
      }
      CHECK_EQ(reads_of_held, static_cast<size_t>(n - 1));  // each peer's input read once
    }
  }
}

NATIVE_TEST(flat_shape, multi_step_plans_are_not_flat) {
  const Schedule ring = plan_of(OpKind::kAllReduce, Algo::kRing, 0, 3, 4096);
  CHECK_EQ(Executor::flat_shape(ring).transfers, -1);
}

NATIVE_TEST(flat_shape, a_receive_is_held_only_when_its_bytes_are_only_read_whole) {
  const size_t b = 16;
  const BufRef out{kOut, 0};
  // Read whole by a copy: held, the copy reads the message.
  {
    Schedule s = {transfer(StepKind::kRecv, 1, kScratch0, b), local(StepKind::kLocalCopy, out, kScratch0, {}, b)};
    const FlatShape f = Executor::flat_shape(s);
    CHECK_EQ(f.transfers, 1);
    CHECK_EQ(f.held, uint64_t{1});
    CHECK_EQ(static_cast<int>(f.from[0][0]), 0);
  }
  // Written by a later step: not held (the step would read what it wrote).
  {
    Schedule s = {transfer(StepKind::kRecv, 1, kScratch0, b), local(StepKind::kLocalReduce, kScratch0, kScratch0, out, b),
                  local(StepKind::kLocalCopy, out, kScratch0, {}, b)};
    CHECK_EQ(Executor::flat_shape(s).held, uint64_t{0});
  }
  // Read in part: not held (a read of half the message names other bytes).
  {
    Schedule s = {transfer(StepKind::kRecv, 1, kScratch0, b), local(StepKind::kLocalCopy, out, kScratch0 + 4, {}, 8)};
    CHECK_EQ(Executor::flat_shape(s).held, uint64_t{0});
  }
  // Into the caller's buffer: never held (the data must land there).
  {
    Schedule s = {transfer(StepKind::kRecv, 1, out, b), local(StepKind::kLocalCopy, BufRef{kOut, b}, out, {}, b)};
    CHECK_EQ(Executor::flat_shape(s).held, uint64_t{0});
  }
  // A publish of its address: not held (the address must be the scratch's).
  {
    Schedule s = {transfer(StepKind::kRecv, 1, kScratch0, b), local(StepKind::kPublish, BufRef{kAddrs, 0}, kScratch0, {}, 8)};
    CHECK_EQ(Executor::flat_shape(s).held, uint64_t{0});
  }
  // Sent by this plan as well: not held.
  {
    Schedule s = {transfer(StepKind::kRecv, 1, kScratch0, b), transfer(StepKind::kSend, 2, kScratch0, b)};
    CHECK_EQ(Executor::flat_shape(s).held, uint64_t{0});
  }
  // Two receives from one peer: not flat at all (one FIFO, two messages).
  {
    Schedule s = {transfer(StepKind::kRecv, 1, kScratch0, b), transfer(StepKind::kRecv, 1, kScratch0 + b, b)};
    CHECK_EQ(Executor::flat_shape(s).transfers, -1);
  }
}
