#include "transport/shm/segment_header.h"

#include <string>

#include "ringcomm/types.h"
#include "transport/shm/segment.h"

namespace ringcomm {

size_t slot_data_bytes(size_t slot_bytes) { return (slot_bytes + 2 * kPage - 1) / kPage * kPage; }

uint32_t payload_offset_for(uint64_t lap, uint32_t page_offset, size_t nbytes, size_t slot_bytes) {
  page_offset %= kPage;
  if (nbytes < kRotateMinBytes || nbytes > slot_bytes / 2) return page_offset;
  const size_t span = (page_offset + nbytes + kPage - 1) / kPage * kPage;
  const size_t places = slot_data_bytes(slot_bytes) / span;  // >= 1: span <= slot_bytes / 2 + kPage
  return static_cast<uint32_t>((lap % places) * span + page_offset);
}

void check_segment_header(const MsgHeader& h, size_t slot_bytes, int peer) {
  if (h.nbytes > slot_bytes || uint64_t{h.payload_offset} + h.nbytes > slot_data_bytes(slot_bytes)) {
    throw Error("ringcomm: corrupt segment header from rank " + std::to_string(peer));
  }
}

}  // namespace ringcomm
