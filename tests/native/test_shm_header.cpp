// transport/shm/segment_header.h: where a sender puts a payload in a slot, and
// the check a rank makes on a segment header a peer wrote into its inbox.
#include <string>

#include "check.h"
#include "transport/shm/segment_header.h"

using namespace ringcomm;

namespace {

MsgHeader header(uint32_t nbytes, uint32_t offset) {
  MsgHeader h;
  h.nbytes = nbytes;
  h.payload_offset = offset;
  return h;
}

}  // namespace

NATIVE_TEST(shm_header, payloads_within_the_slot_pass) {
  for (size_t slot : {size_t{64}, size_t{4096}, size_t{128 * 1024}}) {
    check_segment_header(header(0, 0), slot, 1);
    check_segment_header(header(static_cast<uint32_t>(slot), 0), slot, 1);
    check_segment_header(header(static_cast<uint32_t>(slot), 4095), slot, 1);
    check_segment_header(header(1, 4095), slot, 1);
  }
}

NATIVE_TEST(shm_header, payloads_past_the_first_page_pass_while_they_end_in_the_slot) {
  // The data area of a 128 KiB slot is 132 KiB (a page of slack for any page offset).
  const size_t slot = 128 * 1024;
  CHECK_EQ(slot_data_bytes(slot), slot + 4096);
  CHECK_EQ(slot_data_bytes(64), size_t{8192});  // 64 B at any page offset spill into a second page
  check_segment_header(header(32 * 1024, 100 * 1024), slot, 1);
  check_segment_header(header(4096, static_cast<uint32_t>(slot)), slot, 1);
  CHECK_THROWS(check_segment_header(header(4097, static_cast<uint32_t>(slot)), slot, 4), "rank 4");
  CHECK_THROWS(check_segment_header(header(1, static_cast<uint32_t>(slot) + 4096), slot, 6), "rank 6");
}

NATIVE_TEST(shm_header, payloads_move_lap_by_lap_within_the_slot) {
  const size_t slot = 128 * 1024;
  // Small, very large, and half-slot-plus payloads stay in the first page.
  for (uint64_t lap : {0, 1, 7}) {
    CHECK_EQ(payload_offset_for(lap, 100, 8, slot), 100u);
    CHECK_EQ(payload_offset_for(lap, 100, kRotateMinBytes - 1, slot), 100u);
    CHECK_EQ(payload_offset_for(lap, 100, slot / 2 + 1, slot), 100u);
    CHECK_EQ(payload_offset_for(lap, 0, slot, slot), 0u);
    CHECK_EQ(payload_offset_for(lap, 4096 + 5, 8, slot), 5u);  // an offset within a page
  }
  // 32 KiB at page offset 0: four places (132 KiB / 32 KiB), one per lap, then again.
  uint32_t seen[4];
  for (uint64_t lap = 0; lap < 8; ++lap) {
    const uint32_t off = payload_offset_for(lap, 0, 32 * 1024, slot);
    CHECK_EQ(off, static_cast<uint32_t>((lap % 4) * 32 * 1024));
    if (lap < 4) seen[lap] = off;
  }
  CHECK(seen[0] != seen[1] && seen[1] != seen[2] && seen[2] != seen[3]);
  // Every size and page offset: the page offset kept, the payload inside the data
  // area, and a header carrying it accepted.
  for (size_t n = kRotateMinBytes - 8; n <= slot; n += 4093) {
    for (uint32_t po : {0u, 1u, 64u, 4095u}) {
      for (uint64_t lap = 0; lap < 40; ++lap) {
        const uint32_t off = payload_offset_for(lap, po, n, slot);
        CHECK_EQ(off % 4096, po);
        CHECK(off + n <= slot_data_bytes(slot));
        check_segment_header(header(static_cast<uint32_t>(n), off), slot, 0);
      }
    }
  }
  // A slot too small to hold two: no move.
  CHECK_EQ(payload_offset_for(3, 4095, 16 * 1024, 32 * 1024), 4095u);
}

NATIVE_TEST(shm_header, corrupt_headers_are_refused_naming_the_peer) {
  CHECK_THROWS(check_segment_header(header(4097, 0), 4096, 3), "corrupt segment header from rank 3");
  CHECK_THROWS(check_segment_header(header(1, 8192), 4096, 2), "corrupt segment header from rank 2");
  CHECK_THROWS(check_segment_header(header(0xffffffffu, 0), 128 * 1024, 0), "rank 0");
  CHECK_THROWS(check_segment_header(header(0, 0xffffffffu), 128 * 1024, 5), "rank 5");
}
