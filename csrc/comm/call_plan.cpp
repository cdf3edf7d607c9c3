#include "comm/call_plan.h"
#include "comm/describe.h"

#include "ringcomm/types.h"

namespace ringcomm {

size_t scratch_bytes(const CallPlan& d, size_t elem, int world) {
  const size_t bytes = d.count * elem;
  switch (d.algo) {
    case Algo::kOneShot: return d.kind == OpKind::kAllReduce ? bytes * static_cast<size_t>(world) : 0;
    case Algo::kRecursiveDoubling:
    case Algo::kRabenseifner: return d.kind == OpKind::kAllReduce ? bytes : 0;
    case Algo::kTree: return d.kind == OpKind::kReduce ? 2 * bytes : 0;
    case Algo::kHierarchical:
      return d.kind == OpKind::kReduce ? 3 * bytes
             : d.kind == OpKind::kReduceScatter ? bytes * static_cast<size_t>(world) : 0;
    default: return 0;
  }
}

void call_buffer_bytes(OpKind kind, size_t count, size_t elem, int world, size_t* in, size_t* out) {
  const size_t b = count * elem, all = b * static_cast<size_t>(world);
  switch (kind) {
    case OpKind::kReduceScatter:
    case OpKind::kScatter: *in = all, *out = b; return;
    case OpKind::kAllGather:
    case OpKind::kGather: *in = b, *out = all; return;
    case OpKind::kAllToAll: *in = b, *out = b; return;
    case OpKind::kAllReduce:
    case OpKind::kBroadcast:
    case OpKind::kReduce: *in = 0, *out = b; return;  // in place
    default: *in = 0, *out = 0; return;
  }
}

CallPlan plan_of(const AddressedCall& a, size_t elem, int world) {
  CallPlan call;
  call.kind = a.kind;
  call.count = a.count;
  call.root = a.root;
  call.avg = a.avg;
  call.algo = a.algo;
  size_t in_bytes, out_bytes;
  call_buffer_bytes(a.kind, a.count, elem, world, &in_bytes, &out_bytes);
  call_buffers(a.out, out_bytes, a.in, in_bytes, &call);
  return call;
}

PlanBuffers buffers_of(const AddressedCall& a) {
  PlanBuffers b;
  b.base[kOut] = a.out;
  b.base[kIn] = const_cast<char*>(a.in);  // never written: the plan writes only outputs and scratch
  b.base[kScratch] = a.scratch;
  return b;
}

namespace {

ScheduleFamily plan_family(const PlanContext& c, const CallPlan& d) {
  const size_t bytes = d.count * c.elem;
  const bool pull = d.algo == Algo::kPull;
  switch (d.kind) {
    case OpKind::kAllReduce:
      switch (d.algo) {
        case Algo::kOneShot:
          oneshot_all_reduce(c, d.out, d.count, d.scratch, d.avg);
          return kFamilyOneShot;
        case Algo::kRecursiveDoubling:
          recursive_doubling_all_reduce(c, d.out, d.count, d.scratch, d.avg);
          return kFamilyRecursiveDoubling;
        case Algo::kRabenseifner:
          rabenseifner_all_reduce(c, d.out, d.count, d.scratch, d.avg);
          return kFamilyRabenseifner;
        case Algo::kPull:
          pull_all_reduce(c, d.out, d.count, d.avg);
          return kFamilyPull;
        case Algo::kHierarchical:
          hierarchical_all_reduce(c, d.out, d.count, d.avg);
          return kFamilyHierarchical;
        default:
          ring_all_reduce(c, d.out, d.count, d.avg);
          return kFamilyRing;
      }
    case OpKind::kReduceScatter:
      if (d.algo == Algo::kHierarchical) {
        hierarchical_reduce_scatter(c, d.in, d.out, d.count, d.scratch, d.avg);
        return kFamilyHierarchical;
      }
      if (pull) {
        pull_reduce_scatter(c, d.in, d.out, d.count, d.avg);
      } else {
        ring_reduce_scatter(c, d.in, d.out, d.count, d.avg);
      }
      break;
    case OpKind::kAllGather:
      if (d.algo == Algo::kBruck) {
        bruck_all_gather(c, d.in, d.out, d.count);
        return kFamilyBruck;
      }
      if (d.algo == Algo::kHierarchical) {
        hierarchical_all_gather(c, d.in, d.out, d.count);
        return kFamilyHierarchical;
      }
      if (d.algo == Algo::kDirect) {
        direct_all_gather(c, d.in, d.out, bytes);
        return kFamilyDirect;
      }
      if (pull) {
        pull_all_gather(c, d.in, d.out, d.count);
      } else {
        ring_all_gather(c, d.in, d.out, d.count);
      }
      break;
    case OpKind::kBroadcast:
      if (d.algo == Algo::kTree) {
        if (c.covering && !c.members) {
          covering_tree_broadcast(c, d.root, d.out, bytes);
        } else {
          tree_broadcast(c, d.root, d.out, bytes);
        }
        return kFamilyTree;
      }
      if (d.algo == Algo::kHierarchical) {
        hierarchical_broadcast(c, d.root, d.out, bytes);
        return kFamilyHierarchical;
      }
      if (pull) {
        pull_broadcast(c, d.root, d.out, bytes);
      } else {
        chain_broadcast(c, d.root, d.out, bytes);
      }
      break;
    case OpKind::kReduce:
      if (d.algo == Algo::kTree) {
        if (c.covering && !c.members) {
          covering_tree_reduce(c, d.root, d.out, d.count, d.scratch, d.avg);
        } else {
          tree_reduce(c, d.root, d.out, d.count, d.scratch, d.avg);
        }
        return kFamilyTree;
      }
      if (d.algo == Algo::kHierarchical) {
        hierarchical_reduce(c, d.root, d.out, d.count, d.scratch, d.avg);
        return kFamilyHierarchical;
      }
      if (pull) {
        pull_reduce_to_root(c, d.root, d.out, d.count, d.avg);
      } else {
        chain_reduce(c, d.root, d.out, d.count, d.avg);
      }
      break;
    case OpKind::kScatter:
      if (pull) {
        pull_scatter(c, d.root, d.in, d.out, bytes);
      } else {
        direct_scatter(c, d.root, d.in, d.out, bytes);
      }
      break;
    case OpKind::kGather:
      if (pull) {
        pull_gather(c, d.root, d.in, d.out, bytes);
      } else {
        direct_gather(c, d.root, d.in, d.out, bytes);
      }
      break;
    case OpKind::kAllToAll:
      if (pull) {
        pull_all_to_all(c, d.in, d.out, bytes / c.world);
      } else {
        pairwise_all_to_all(c, d.in, d.out, bytes / c.world);
      }
      break;
    case OpKind::kBarrier:
      dissemination_barrier(c);
      return kFamilyFifo;
    default:
      throw Error("ringcomm: no collective schedule for this call");
  }
  return pull ? kFamilyPull : kFamilyFifo;
}

// Two ranks, a rooted call: a rank whose schedule sends its peer nothing
// sends it an empty message first, one that receives nothing from it
// receives one last (an empty message still carries the call's header).
// Every message's header is checked against the receiver's call (kind,
// dtype, op, family, root, seq, count: the agreement's fields), so two ranks
// that disagree on the call both raise, as the agreement round makes them,
// and without that round: a 4-byte broadcast takes one message each way, at
// once, instead of the agreement's exchange and then the data.
void make_mutual(const PlanContext& c) {
  Schedule& s = *c.out;
  const int peer = 1 - c.rank;
  bool sends = false, recvs = false;
  for (const Step& st : s) {
    sends = sends || (uses_send(st.kind) && st.send_peer == peer);
    recvs = recvs || (uses_recv(st.kind) && st.recv_peer == peer);
  }
  if (!sends) {
    for (Step& st : s) {
      if (st.after != SIZE_MAX) ++st.after;
    }
    Step hello;
    hello.kind = StepKind::kSend;
    hello.send_peer = peer;
    s.insert(s.begin(), hello);
  }
  if (!recvs) p2p_recv(c, peer, BufRef{}, 0);
}

}  // namespace

ScheduleFamily plan_call(const PlanContext& c, const CallPlan& d) {
  const ScheduleFamily f = plan_family(c, d);
  if (is_rooted(d.kind) && !c.members && c.mutual_pair && family_can_be_mutual(f)) make_mutual(c);
  return f;
}

}  // namespace ringcomm
