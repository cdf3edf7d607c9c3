// Human-readable names of calls, for error messages.
#pragma once

#include <string>

#include "ringcomm/msg_tag.h"

namespace ringcomm {

// Kinds of calls; the values travel in message headers.
enum class OpKind : uint8_t {
  kAllReduce = 1,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kScatter,
  kGather,
  kAllToAll,
  kSend,  // point to point: seq counts messages on the pair of ranks
  kBarrier,
};

const char* op_kind_name(OpKind k);
// The collective (barrier included, send/recv not) named `name` as
// op_kind_name spells it; false for any other name.
bool collective_from_name(const std::string& name, OpKind* out);
// Broadcast, reduce, scatter and gather: the calls with a root.
inline bool is_rooted(OpKind k) {
  return k == OpKind::kBroadcast || k == OpKind::kReduce || k == OpKind::kScatter || k == OpKind::kGather;
}
// all_reduce, reduce_scatter and reduce: the calls that combine values.
inline bool op_reduces(OpKind k) {
  return k == OpKind::kAllReduce || k == OpKind::kReduceScatter || k == OpKind::kReduce;
}
// "send to rank 2", "recv from any rank (tag 5)": a point-to-point call's
// name in messages (peer: -1 for a recv from any rank).
std::string p2p_call_name(bool is_send, int peer, int64_t tag);
// "all_reduce(seq 3, float32, count 1000, sum)"
std::string describe_tag(const MsgTag& t);
// A timeout in messages: "300", "0.5", "1.5e+03".
std::string seconds_text(double s);

}  // namespace ringcomm
