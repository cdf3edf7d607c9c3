#include "transport/shm/segment_header.h"

#include <string>

#include "ringcomm/types.h"
#include "transport/shm/segment.h"

namespace ringcomm {

void check_segment_header(const MsgHeader& h, size_t slot_bytes, int peer) {
  if (h.payload_offset >= kPage || h.nbytes > slot_bytes) {
    throw Error("ringcomm: corrupt segment header from rank " + std::to_string(peer));
  }
}

}  // namespace ringcomm
