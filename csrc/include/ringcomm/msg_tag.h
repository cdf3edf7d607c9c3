// The tag every message of a call carries: what both ends of a message must
// agree on. It sits in the common layer because the schedules (algo/step.h)
// name it in their steps and the transports (transport/link.h) put it in
// their headers, and neither layer may include the other for it.
#pragma once

#include <cstdint>

namespace ringcomm {

// `seq` counts collectives on the communicator (or point-to-point messages on
// one pair of ranks).
struct MsgTag {
  uint8_t kind = 0;    // OpKind of the call
  uint8_t dtype = 0;   // DataType
  uint8_t redop = 0;   // ReduceOp, or 0xff when the call does not reduce
  uint8_t algo = 0;   // schedule family (ranks must run the same one)
  int32_t root = -1;   // root / dst / src of the call, -1 when none
  uint64_t seq = 0;
  uint64_t count = 0;  // element count that defines the call (same on all ranks)
  int64_t p2p_tag = 0;  // send/recv: the user's tag (comm/p2p_match.cpp); 0 otherwise
  bool operator==(const MsgTag& o) const {
    return kind == o.kind && dtype == o.dtype && redop == o.redop && algo == o.algo && root == o.root &&
           seq == o.seq && count == o.count && p2p_tag == o.p2p_tag;
  }
};

}  // namespace ringcomm
