#include "comm/describe.h"

#include <cstdio>

#include "algo/schedules.h"

#include "ringcomm/types.h"

namespace ringcomm {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kScatter: return "scatter";
    case OpKind::kGather: return "gather";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kSend: return "send/recv";
    case OpKind::kBarrier: return "barrier";
  }
  return "unknown";
}

bool collective_from_name(const std::string& name, OpKind* out) {
  for (int k = static_cast<int>(OpKind::kAllReduce); k <= static_cast<int>(OpKind::kBarrier); ++k) {
    const OpKind op = static_cast<OpKind>(k);
    if (op != OpKind::kSend && name == op_kind_name(op)) {
      *out = op;
      return true;
    }
  }
  return false;
}

std::string p2p_call_name(bool is_send, int peer, int64_t tag) {
  std::string s = is_send ? "send to rank " + std::to_string(peer)
                  : peer < 0 ? std::string("recv from any rank")
                             : "recv from rank " + std::to_string(peer);
  if (tag != 0) s += " (tag " + std::to_string(tag) + ")";
  return s;
}

std::string describe_tag(const MsgTag& t) {
  std::string s = op_kind_name(static_cast<OpKind>(t.kind));
  s += "(seq " + std::to_string(t.seq);
  if (static_cast<OpKind>(t.kind) != OpKind::kBarrier) {
    s += ", ";
    s += t.dtype < kNumDataTypes ? dtype_name(static_cast<DataType>(t.dtype)) : "?";
    s += ", count " + std::to_string(t.count);
  }
  if (t.redop != 0xff) {
    s += ", ";
    s += t.redop < kNumReduceOps ? reduce_op_name(static_cast<ReduceOp>(t.redop)) : "?";
  }
  if (t.root >= 0) s += ", root " + std::to_string(t.root);
  if (static_cast<OpKind>(t.kind) == OpKind::kSend) s += ", tag " + std::to_string(t.p2p_tag);
  const char* family = schedule_family_name(static_cast<ScheduleFamily>(t.algo));
  if (t.algo != kFamilyFifo && family[0] != '?') {
    s += ", ";
    s += family;
  }
  s += ")";
  return s;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", s);
  return buf;
}

}  // namespace ringcomm
