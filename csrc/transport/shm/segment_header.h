// Where a segment's payload lies in a shared-memory slot: the place a sender
// picks for it, and the check a rank makes on a segment header that a peer
// wrote into its inbox before it touches the payload (pure, so fuzz/ can run
// it under AddressSanitizer and tests/native can pin the arithmetic).
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/link.h"

namespace ringcomm {

// Bytes of a slot's data area (after its header page, see segment.h): room
// for slot_bytes of payload at any page offset.
size_t slot_data_bytes(size_t slot_bytes);

// Payloads of at least this many bytes that fill at most half a slot move
// around within it, lap after lap of the FIFO (payload_offset_for).
constexpr size_t kRotateMinBytes = 16 * 1024;

// Where, from the start of the data area, the payload of `nbytes` bytes that
// asks for `page_offset` within its page goes in a slot on `lap` (the FIFO's
// count of segments / its slots). Small and very large payloads sit in the
// first page (offset == page_offset). A payload of kRotateMinBytes up to half
// a slot moves by its own page-rounded span from one lap to the next, so that
// a call repeated with the same size writes lines the reader last touched
// several laps ago (already gone from its core's cache) instead of lines it
// read one lap ago, whose every store first takes the line back from the
// reader's cache: on a 2-vCPU AMD EPYC VM a 2-rank all_gather of 64 KiB (a
// 32 KiB segment each way) went from 6.2 to 4.9 us a call, all_reduce of 32
// and 64 KiB by 0.6-0.8x where the cores were not in their slow placement
// (docs/performance.md). Always page_offset mod 4096, and
// offset + nbytes <= slot_data_bytes(slot_bytes).
uint32_t payload_offset_for(uint64_t lap, uint32_t page_offset, size_t nbytes, size_t slot_bytes);

// Throws ringcomm::Error("ringcomm: corrupt segment header from rank <peer>")
// unless the payload `h` describes lies within the data area of a slot of
// `slot_bytes`: at most slot_bytes bytes, from payload_offset to its end
// inside slot_data_bytes(slot_bytes).
void check_segment_header(const MsgHeader& h, size_t slot_bytes, int peer);

}  // namespace ringcomm
