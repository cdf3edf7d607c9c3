#include "comm/device_plan.h"

#include "ringcomm/types.h"

namespace ringcomm {

void plan_device_call(const PlanContext& c, const DeviceCall& d) {
  const size_t bytes = d.count * c.elem;
  switch (d.kind) {
    case OpKind::kAllReduce:
      if (d.algo == Algo::kRecursiveDoubling) {
        recursive_doubling_all_reduce(c, d.out, d.count, d.scratch, d.avg);
      } else if (d.algo == Algo::kRabenseifner) {
        rabenseifner_all_reduce(c, d.out, d.count, d.scratch, d.avg);
      } else {
        ring_all_reduce(c, d.out, d.count, d.avg);
      }
      return;
    case OpKind::kReduceScatter:
      ring_reduce_scatter(c, d.in, d.out, d.count, d.avg);
      return;
    case OpKind::kAllGather:
      if (d.algo == Algo::kBruck) {
        bruck_all_gather(c, d.in, d.out, d.count);
      } else {
        ring_all_gather(c, d.in, d.out, d.count);
      }
      return;
    case OpKind::kBroadcast:
      if (d.algo == Algo::kTree) {
        tree_broadcast(c, d.root, d.out, bytes);
      } else {
        chain_broadcast(c, d.root, d.out, bytes);
      }
      return;
    case OpKind::kReduce:
      if (d.algo == Algo::kTree) {
        tree_reduce(c, d.root, d.out, d.count, d.scratch, d.avg);
      } else {
        chain_reduce(c, d.root, d.out, d.count, d.avg);
      }
      return;
    case OpKind::kScatter:
      direct_scatter(c, d.root, d.in, d.out, bytes);
      return;
    case OpKind::kGather:
      direct_gather(c, d.root, d.in, d.out, bytes);
      return;
    case OpKind::kAllToAll:
      pairwise_all_to_all(c, d.in, d.out, bytes / c.world);
      return;
    default:
      throw Error("ringcomm: no device schedule for this call");
  }
}

}  // namespace ringcomm
