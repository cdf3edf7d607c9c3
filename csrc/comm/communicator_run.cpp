// Running a collective: the chooser's pick (comm/chooser.h), its plan (the
// plan cache, memoised for a repeated call), and the executor over the
// call's buffers; explain() reads the same chooser.
#include "comm/communicator.h"

#include "comm/call_plan.h"

#include <algorithm>
#include "ringcomm/copy.h"

namespace ringcomm {

std::vector<std::pair<std::string, double>> Communicator::explain(OpKind kind, size_t nbytes) const {
  ChoiceCall call;
  call.kind = kind;
  call.bytes = nbytes;
  std::vector<std::pair<std::string, double>> out;
  for (const Candidate& c : candidates(choice_context(kind), call)) out.emplace_back(algo_name(c.algo), c.seconds);
  // What the tuner runs for this signature goes first (comm/autotune.h).
  AutoTuner::Report r;
  if (algos_.of(kind) == Algo::kAuto && tuner_.report_of(kind, nbytes, &r) && r.state != AutoTuner::State::kModel) {
    const std::string name = algo_name(r.pick);
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == name; });
    if (it != out.end()) std::rotate(out.begin(), it, it + 1);
  }
  return out;
}

const Plan& Communicator::plan(Call& c, size_t* out_bytes_out) {
  const size_t elem = dtype_size(static_cast<DataType>(c.tag.dtype));
  // Both buffers hold the call's dtype (the entry points check it).
  const size_t out_bytes = c.a.count * elem, in_bytes = c.b.count * elem;
  *out_bytes_out = out_bytes;
  CallPlan call;
  call.kind = c.kind;
  call_buffers(c.a.ptr, out_bytes, c.b.ptr, in_bytes, &call);
  const bool avg = c.reduces && c.redop == ReduceOp::kAvg;
  PlanMemo& m = memo_;
  if (m.valid && m.kind == c.kind && m.dtype == c.tag.dtype && m.avg == avg && m.root == c.root &&
      m.a_count == c.a.count && m.b_count == c.b.count && m.out == call.out && m.in == call.in &&
      m.generation == plan_cache_.generation()) {
    plan_cache_.count_hit();
    c.tag.algo = m.plan->family;
    teach_check_memo(c, *m.plan);
    return *m.plan;
  }
  const size_t slice = ring_slice_elems(config_.slot_bytes, config_.nslots, elem);
  PlanContext ctx{rank_, world_, elem, slice, nullptr};
  ctx.topo = &topo_;
  ctx.mutual_pair = wants_mutual_pair(world_, config_.check_agreement);
  ctx.covering = wants_covering(world_, config_.check_agreement);
  if (!ring_identity_) {
    ctx.ring = ring_order_.data();
    ctx.ring_pos = ring_pos_;
  }
  const bool by_input = c.kind == OpKind::kAllGather || c.kind == OpKind::kGather || c.kind == OpKind::kAllToAll;
  call.count = by_input ? c.b.count : c.a.count;
  call.root = c.root;
  call.avg = avg;
  if (c.kind != OpKind::kBarrier) call.algo = resolve_algo(c);
  const size_t need = scratch_bytes(call, elem, world_);
  if (scratch_.size() < need) scratch_.resize(need);
  const Plan& p = plan_cache_.plan(ctx, call);
  c.tag.algo = p.family;
  m.valid = plan_cache_.kept(p);
  m.kind = c.kind;
  m.dtype = c.tag.dtype;
  m.avg = avg;
  m.root = c.root;
  m.a_count = c.a.count;
  m.b_count = c.b.count;
  m.out = call.out;
  m.in = call.in;
  m.generation = plan_cache_.generation();
  m.plan = &p;
  if (m.valid) teach_check_memo(c, p);
  return p;
}

// The check memo's call learns its kept plan (see Call::plan).
void Communicator::teach_check_memo(const Call& c, const Plan& p) {
  if (!c.memo_owner || !c.a.ptr || c.b.ptr) return;
  check_memo_.call.plan = &p;
  check_memo_.call.plan_generation = plan_cache_.generation();
}

Algo Communicator::resolve_algo(const Call& c) const { return resolve_algo(c.kind, c.model_bytes); }

// What `auto` (or a forced choice this rank cannot run) means for a call:
// the chooser (comm/chooser.h), from what every rank knows alike (the
// configuration, the size, whether every rank can pull, the topology and
// the agreed cost model), so that all ranks pick the same family.
ChoiceContext Communicator::choice_context(OpKind kind) const {
  ChoiceContext ctx;
  ctx.device = Device::kCpu;
  ctx.configured = algos_.of(kind);
  ctx.model = &model_;
  ctx.pull_ok = pull_ok_;
  return ctx;
}

Algo Communicator::resolve_algo(OpKind kind, size_t bytes) const {
  if (tuner_.on() && algos_.of(kind) == Algo::kAuto) {
    const Algo tuned = tuner_.override_for(kind, bytes);
    if (tuned != Algo::kAuto) return tuned;
  }
  ChoiceCall call;
  call.kind = kind;
  call.bytes = bytes;
  return choose(choice_context(kind), call);
}

void Communicator::run_call(Call& c) {
  size_t out_bytes;
  // A call of the check memo's signature (an in-place op: one buffer, its
  // form {kOut, 0} whenever it has an address) runs the plan it ran before.
  const bool known = c.plan && c.a.ptr && c.plan_generation == plan_cache_.generation();
  if (known) {
    plan_cache_.count_hit();
    c.tag.algo = c.plan->family;
    out_bytes = c.a.nbytes();
  }
  const Plan& p = known ? *c.plan : plan(c, &out_bytes);
  const CallInfo info = info_of(c);
  const Clock::time_point deadline = deadline_from_now();
  // (Two ranks, or a covering tree: the plan itself has every rank hear from every other.)
  if (is_rooted(c.kind) && config_.check_agreement &&
      !plan_checks_itself(world_, config_.check_agreement, c.kind, p.family)) {
    agree_on_call(c, deadline, info);
  }
  executor_.set_streaming(out_bytes >= kStreamingCopyMinBytes);  // c.a: the output
  PlanBuffers bufs;
  bufs.base[kOut] = c.a.ptr;
  bufs.base[kIn] = c.b.ptr;
  bufs.base[kScratch] = scratch_.data();
  bufs.base[kAddrs] = reinterpret_cast<char*>(addrs_.data());
  executor_.run(p.steps, bufs, c.tag, c.reduces ? &c.reducer : nullptr, deadline, info, nullptr, &p.flat);
  if (tuner_.on() && c.kind != OpKind::kBarrier && algos_.of(c.kind) == Algo::kAuto &&
      tuner_.wants_time(c.kind, c.model_bytes)) {
    tune_after(c, deadline - timeout_, deadline, info);
  }
}

void Communicator::execute(Call& c, Work& work, const std::string& failed_earlier) {
  if (!failed_earlier.empty()) {
    work.fail(Work::ErrorKind::kError, "ringcomm: " + std::string(c.name()) +
                                           " was not run: the communicator failed earlier (" + failed_earlier + ")");
    return;
  }
  Work::ErrorKind kind = Work::ErrorKind::kNone;
  std::string message;
  record(c, CallState::kRunning);
  try {
    run_call(c);
    record(c, CallState::kFinished);
    work.complete();
    return;
  } catch (const std::exception& e) {
    kind = error_kind_of(e);
    message = e.what();
  }
  record(c, CallState::kFailed);
  fail(message);
  work.fail(kind, message);
}

// submit() checked under mu_ that the communicator is usable and claimed it
// (running_); the caller releases it.
void Communicator::run_inline(Call& c) {
  record(c, CallState::kRunning);
  try {
    run_call(c);
  } catch (const std::exception& e) {
    record(c, CallState::kFailed);
    fail(e.what());
    throw;
  }
  record(c, CallState::kFinished);
}

}  // namespace ringcomm
