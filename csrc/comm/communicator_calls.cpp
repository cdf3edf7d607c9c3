// The public calls: each is described once (comm/call_check.h CallDesc),
// checked once (check_call; the in-place ops' result memoised per
// signature) and handed to submit() as a Call.
#include "comm/communicator.h"

#include "ringcomm/reducer.h"

namespace ringcomm {

namespace {

constexpr uint8_t kNoReduce = 0xff;

}  // namespace

Communicator::Call Communicator::collective(OpKind kind, DataType dtype, size_t count,
                                            const char* name) {
  Call c;
  c.kind = kind;
  c.op = name;
  c.tag.kind = static_cast<uint8_t>(kind);
  c.tag.dtype = static_cast<uint8_t>(dtype);
  c.tag.redop = kNoReduce;
  c.tag.count = count;
  return c;
}

// The call a checked descriptor describes (comm/call_check.h holds every rule).
Communicator::Call Communicator::checked(const CallDesc& d, bool sole) {
  // The in-place ops' rules read only the signature (presence, dtype, op,
  // root, world), so a call with the last one's signature passes as it did:
  // its checked call is reused with this call's buffer. (A training loop
  // repeats its calls; a small all_reduce's check would otherwise cost a
  // fifth of the call.) The memo is only read and written by a thread that
  // entered the communicator when no other thread was inside (`sole`, from
  // Inside): that thread has it to itself, and the counter's acq_rel
  // updates order its accesses after those of the thread before it. Other
  // threads (a second thread's call is itself an error the communicator
  // reports) check afresh.
  const bool in_place = d.kind == OpKind::kAllReduce || d.kind == OpKind::kBroadcast || d.kind == OpKind::kReduce;
  const bool memo = sole && in_place;
  const CheckMemo& m = check_memo_;
  if (memo && d.out.present && m.valid && m.call.kind == d.kind && m.dtype == d.out.dtype &&
      m.count == d.out.count && m.call.root == (is_rooted(d.kind) ? d.root : -1) &&
      (!d.reduces || m.call.redop == d.op)) {
    return memo_call(d.out);
  }
  return checked_afresh(d, memo);
}

// (Each returns its one Call as it is: no copy into the caller's.)
Communicator::Call Communicator::memo_call(const Buffer& x) const {
  Call c = check_memo_.call;
  c.a = x;
  c.memo_owner = true;
  return c;
}

Communicator::Call Communicator::checked_afresh(const CallDesc& d, bool memo) {
  check_call(d);
  Call c = collective(d.kind, call_dtype(d), call_count(d), op_kind_name(d.kind));
  if (d.reduces) {
    c.reducer = make_reducer(call_dtype(d), d.op);
    c.redop = d.op;
    c.reduces = true;
  }
  c.a = d.out;
  c.b = d.in;
  c.model_bytes = call_model_bytes(d);
  // A rooted call's root-only buffer is not used on the other ranks.
  if (d.kind == OpKind::kScatter && rank_ != d.root) c.b = Buffer{};
  if (d.kind == OpKind::kGather && rank_ != d.root) c.a = Buffer{};
  if (is_rooted(d.kind)) {
    c.root = d.root;
    c.tag.root = d.root;
  }
  if (memo) {
    check_memo_ = {true, d.out.dtype, d.out.count, c};
    c.memo_owner = true;
  }
  return c;
}

std::shared_ptr<Work> Communicator::all_reduce(Buffer x, ReduceOp op, bool async) {
  Inside inside(inside_);
  Call c = checked(describe_call(OpKind::kAllReduce, rank_, world_, x, Buffer{}, -1, op), inside.sole);
  return submit(std::move(c), async);
}

std::shared_ptr<Work> Communicator::reduce_scatter(Buffer out, Buffer in, ReduceOp op, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kReduceScatter, rank_, world_, out, in, -1, op), inside.sole), async);
}

std::shared_ptr<Work> Communicator::all_gather(Buffer out, Buffer in, bool async) {
  Inside inside(inside_);
  Call c = checked(describe_call(OpKind::kAllGather, rank_, world_, out, in, -1, ReduceOp::kSum), inside.sole);
  return submit(std::move(c), async);
}

std::shared_ptr<Work> Communicator::broadcast(Buffer x, int src, bool async) {
  Inside inside(inside_);
  Call c = checked(describe_call(OpKind::kBroadcast, rank_, world_, x, Buffer{}, src, ReduceOp::kSum), inside.sole);
  return submit(std::move(c), async);
}

std::shared_ptr<Work> Communicator::reduce(Buffer x, int dst, ReduceOp op, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kReduce, rank_, world_, x, Buffer{}, dst, op), inside.sole), async);
}

std::shared_ptr<Work> Communicator::scatter(Buffer out, Buffer in, int src, bool async) {
  Inside inside(inside_);
  Call c = checked(describe_call(OpKind::kScatter, rank_, world_, out, in, src, ReduceOp::kSum), inside.sole);
  return submit(std::move(c), async);
}

std::shared_ptr<Work> Communicator::gather(Buffer out, Buffer in, int dst, bool async) {
  Inside inside(inside_);
  Call c = checked(describe_call(OpKind::kGather, rank_, world_, out, in, dst, ReduceOp::kSum), inside.sole);
  return submit(std::move(c), async);
}

std::shared_ptr<Work> Communicator::all_to_all(Buffer out, Buffer in, bool async) {
  Inside inside(inside_);
  Call c = checked(describe_call(OpKind::kAllToAll, rank_, world_, out, in, -1, ReduceOp::kSum), inside.sole);
  return submit(std::move(c), async);
}

Communicator::Call Communicator::p2p_call(const Buffer& x, int peer, int64_t tag, bool is_send) {
  check_call(describe_p2p(is_send, rank_, world_, x, peer));
  Call c = collective(OpKind::kSend, x.dtype, x.count, is_send ? "send" : "recv");
  c.a = x;
  c.root = peer;
  c.is_send = is_send;
  c.p2p_tag = tag;
  c.tag.p2p_tag = tag;
  return c;
}

std::shared_ptr<Work> Communicator::send(Buffer x, int dst, int64_t tag, bool async) {
  Inside inside(inside_);
  return submit(p2p_call(x, dst, tag, true), async);
}

std::shared_ptr<Work> Communicator::recv(Buffer x, int src, int64_t tag, bool async, int* source) {
  Inside inside(inside_);
  return submit(p2p_call(x, src, tag, false), async, source);
}

std::shared_ptr<Work> Communicator::barrier(bool async) {
  Inside inside(inside_);
  Call c = collective(OpKind::kBarrier, DataType::kUInt8, 0, "barrier");
  return submit(std::move(c), async);
}

}  // namespace ringcomm
