#include "comm/ipc_collectives.h"

#include <algorithm>

namespace ringcomm {

IpcCollectives::IpcCollectives(std::unique_ptr<IpcChannel> channel, IpcThresholds thresholds)
    : ch_(std::move(channel)), th_(thresholds), ops_(ch_.get()), executor_(ch_->geometry().slot_bytes) {
  schedule_.reserve(256);
}

IpcCollectives::~IpcCollectives() {
  if (scratch_) ch_->memory().free_scratch(scratch_);
}

void IpcCollectives::allocate() { executor_.allocate(ops_); }

void IpcCollectives::all_reduce(uint64_t seq, char* x, size_t count, DataType dtype, ReduceOp op,
                                Algo chosen, Algo family) {
  switch (chosen) {
    case Algo::kOneShot:
      ch_->begin("all_reduce", seq);
      ch_->one_shot_all_reduce(dtype, op, x, x, count);
      return;
    case Algo::kTwoShot:
      ch_->begin("all_reduce", seq);
      ch_->two_shot_all_reduce(dtype, op, x, x, count);
      return;
    default: {
      AddressedCall call{OpKind::kAllReduce, x, nullptr, count, -1, op == ReduceOp::kAvg};
      call.algo = family;
      run("all_reduce", seq, call, dtype, op);
    }
  }
}

void IpcCollectives::run(const char* what, uint64_t seq, const AddressedCall& call, DataType dtype, ReduceOp op) {
  const size_t elem = dtype_size(dtype);
  // Families that need scratch (doubling, tree reduce) get a buffer that
  // only grows: no allocation per call once it is big enough.
  AddressedCall planned = call;
  const size_t need = scratch_bytes(plan_of(call, elem, ch_->world()), elem, ch_->world());
  if (need > scratch_cap_) {
    if (scratch_) ch_->memory().free_scratch(scratch_);
    scratch_ = nullptr;
    scratch_cap_ = 0;
    scratch_ = ch_->memory().alloc_scratch(need);
    scratch_cap_ = need;
  }
  if (need) planned.scratch = scratch_;
  schedule_.clear();
  const size_t chunk = ch_->geometry().slot_bytes;
  PlanContext ctx{ch_->rank(), ch_->world(), elem, std::max<size_t>(1, chunk / elem), &schedule_};
  plan_call(ctx, plan_of(planned, elem, ch_->world()));
  ch_->begin(what, seq);
  executor_.run(schedule_, buffers_of(planned), ops_, dtype, op);
}

void IpcCollectives::p2p(const char* what, uint64_t seq, const std::vector<IpcP2p>& ops) {
  ch_->begin(what, seq);
  ch_->group(ops);
}

}  // namespace ringcomm
