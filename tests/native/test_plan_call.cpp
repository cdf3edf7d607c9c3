// comm/call_plan.h: the schedules plan_call makes for every rank of a call,
// world 1..5, checked without any transport: the step counts the ring
// arithmetic predicts, and that what each rank sends to a peer is, message
// by message, what that peer receives from it (the FIFOs pair up).
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "comm/call_plan.h"

using namespace ringcomm;

namespace {

constexpr size_t kElem = 4;
constexpr size_t kSlice = 3;  // elements of each block per ring round: several rounds per call

struct Planned {
  std::vector<Schedule> steps;  // by rank
};

// Whether every buffer a step names is one the call has (plans name buffers
// by id and offset: algo/step.h BufRef).
bool refs_known(const Step& s, bool has_in, bool has_scratch) {
  for (const BufRef& r : {s.dst, s.src, s.src2}) {
    if (r.buf == kIn && !has_in) return false;
    if (r.buf == kScratch && !has_scratch) return false;
    if (r.buf >= kNumBufs) return false;
  }
  return true;
}

Planned plan_all(OpKind kind, Algo algo, int world, size_t count, int root = -1) {
  Planned p;
  p.steps.resize(world);
  for (int r = 0; r < world; ++r) {
    CallPlan call;
    call.kind = kind;
    call.count = count;
    call.root = root;
    call.algo = algo;
    size_t in = 0, out = 0;
    call_buffer_bytes(kind, count, kElem, world, &in, &out);
    call.out = BufRef{kOut, 0};
    call.in = in ? BufRef{kIn, 0} : BufRef{};
    const bool has_scratch = scratch_bytes(call, kElem, world) > 0;
    PlanContext c{r, world, kElem, kSlice, &p.steps[r]};
    plan_call(c, call);
    for (const Step& s : p.steps[r]) CHECK(refs_known(s, in > 0, has_scratch));
  }
  return p;
}

// Messages (their sizes, in order) on the FIFO from rank a to rank b, as a
// sends them and as b receives them; equal for every pair when the plans match.
std::string unpaired(const Planned& p) {
  const int world = static_cast<int>(p.steps.size());
  std::map<std::pair<int, int>, std::vector<size_t>> sent, received;
  for (int r = 0; r < world; ++r) {
    for (const Step& s : p.steps[r]) {
      if (uses_send(s.kind)) {
        if (s.send_peer < 0 || s.send_peer >= world || s.send_peer == r) return "rank " + std::to_string(r) + " sends to " + std::to_string(s.send_peer);
        sent[{r, s.send_peer}].push_back(s.nbytes);
      }
      if (uses_recv(s.kind)) {
        if (s.recv_peer < 0 || s.recv_peer >= world || s.recv_peer == r) return "rank " + std::to_string(r) + " receives from " + std::to_string(s.recv_peer);
        received[{s.recv_peer, r}].push_back(s.nbytes);
      }
    }
  }
  for (int a = 0; a < world; ++a) {
    for (int b = 0; b < world; ++b) {
      if (sent[{a, b}] != received[{a, b}]) {
        return "FIFO " + std::to_string(a) + " -> " + std::to_string(b) + ": " +
               std::to_string(sent[{a, b}].size()) + " messages sent, " + std::to_string(received[{a, b}].size()) +
               " received (or sizes differ)";
      }
    }
  }
  return {};
}

size_t fifo_steps(const Schedule& s) {
  size_t n = 0;
  for (const Step& st : s) n += uses_send(st.kind) || uses_recv(st.kind);
  return n;
}

const OpKind kCollectives[] = {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather, OpKind::kBroadcast,
                               OpKind::kReduce, OpKind::kScatter, OpKind::kGather, OpKind::kAllToAll};

}  // namespace

NATIVE_TEST(plan_call, ring_all_reduce_step_counts) {
  // Per round: n steps of the reduce-scatter part and n-1 of the all-gather
  // part (algo/ring.cpp); one round per kSlice elements of the largest block.
  for (int n = 1; n <= 5; ++n) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{5 * kSlice}, size_t{5 * kSlice + 1}, size_t{40}}) {
      const Planned p = plan_all(OpKind::kAllReduce, Algo::kAuto, n, count);
      const size_t rounds = rounds_for(ring_block(count, n, 0).count, kSlice);
      for (int r = 0; r < n; ++r) {
        CHECK_EQ(p.steps[r].size(), n == 1 ? size_t{0} : rounds * (2 * static_cast<size_t>(n) - 1));
      }
    }
  }
}

NATIVE_TEST(plan_call, ring_reduce_scatter_and_all_gather_step_counts) {
  // One part of the ring each: n FIFO steps per round (algo/ring.cpp).
  for (int n = 2; n <= 5; ++n) {
    const size_t per_rank = 2 * kSlice + 1;  // 3 rounds
    const Planned rs = plan_all(OpKind::kReduceScatter, Algo::kAuto, n, per_rank);
    const Planned ag = plan_all(OpKind::kAllGather, Algo::kAuto, n, per_rank);
    for (int r = 0; r < n; ++r) {
      CHECK_EQ(fifo_steps(rs.steps[r]), 3 * static_cast<size_t>(n));
      CHECK_EQ(fifo_steps(ag.steps[r]), 3 * static_cast<size_t>(n));
    }
  }
}

NATIVE_TEST(plan_call, sends_and_receives_pair_across_ranks) {
  for (int n = 1; n <= 5; ++n) {
    for (OpKind kind : kCollectives) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{60}}) {
        const bool rooted = is_rooted(kind);
        for (int root = rooted ? 0 : -1; root < (rooted ? n : 0); ++root) {
          const Planned p = plan_all(kind, Algo::kAuto, n, kind == OpKind::kAllToAll ? count * n : count, root);
          const std::string why = unpaired(p);
          if (!why.empty()) {
            native_test::fail(__FILE__, __LINE__, "plans pair up",
                              std::string(op_kind_name(kind)) + " world " + std::to_string(n) + " count " +
                                  std::to_string(count) + " root " + std::to_string(root) + ": " + why);
          }
        }
      }
    }
  }
}

NATIVE_TEST(plan_call, other_families_pair_up) {
  struct Case {
    OpKind kind;
    Algo algo;
  };
  const Case cases[] = {{OpKind::kAllReduce, Algo::kOneShot},   {OpKind::kAllReduce, Algo::kRecursiveDoubling},
                        {OpKind::kAllReduce, Algo::kRabenseifner}, {OpKind::kAllGather, Algo::kBruck},
                        {OpKind::kBroadcast, Algo::kTree},      {OpKind::kReduce, Algo::kTree}};
  for (const Case& c : cases) {
    for (int n = 1; n <= 5; ++n) {
      for (size_t count : {size_t{1}, size_t{17}}) {
        const int root = is_rooted(c.kind) ? n - 1 : -1;
        const Planned p = plan_all(c.kind, c.algo, n, count, root);
        const std::string why = unpaired(p);
        if (!why.empty()) {
          native_test::fail(__FILE__, __LINE__, "plans pair up",
                            std::string(op_kind_name(c.kind)) + " algo " + std::to_string(static_cast<int>(c.algo)) +
                                " world " + std::to_string(n) + ": " + why);
        }
        if (n == 1) {
          for (const Step& s : p.steps[0]) CHECK(!uses_send(s.kind) && !uses_recv(s.kind));
        }
      }
    }
  }
}

NATIVE_TEST(plan_call, direct_scatter_sends_one_block_to_each_rank) {
  for (int n = 1; n <= 5; ++n) {
    const Planned p = plan_all(OpKind::kScatter, Algo::kAuto, n, 6, /*root=*/0);
    CHECK_EQ(fifo_steps(p.steps[0]), static_cast<size_t>(n - 1));
    for (int r = 1; r < n; ++r) {
      CHECK_EQ(fifo_steps(p.steps[r]), size_t{1});
      for (const Step& s : p.steps[r]) {
        if (uses_recv(s.kind)) CHECK_EQ(s.nbytes, 6 * kElem);
      }
    }
  }
}
