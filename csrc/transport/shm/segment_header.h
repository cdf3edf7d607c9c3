// The check a rank makes on a segment header that a peer wrote into its
// shared-memory inbox, before it touches the payload (pure, so fuzz/ can run
// it under AddressSanitizer).
#pragma once

#include <cstddef>

#include "transport/link.h"

namespace ringcomm {

// Throws ringcomm::Error("ringcomm: corrupt segment header from rank <peer>")
// unless the payload `h` describes lies within the data area of a slot of
// `slot_bytes` (see segment.h): it starts within the first page
// (payload_offset < kPage) and holds at most slot_bytes bytes.
void check_segment_header(const MsgHeader& h, size_t slot_bytes, int peer);

}  // namespace ringcomm
