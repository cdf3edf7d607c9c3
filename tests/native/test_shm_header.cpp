// transport/shm/segment_header.h: the check a rank makes on a segment header
// a peer wrote into its shared-memory inbox.
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

NATIVE_TEST(shm_header, corrupt_headers_are_refused_naming_the_peer) {
  CHECK_THROWS(check_segment_header(header(4097, 0), 4096, 3), "corrupt segment header from rank 3");
  CHECK_THROWS(check_segment_header(header(1, 4096), 4096, 2), "corrupt segment header from rank 2");
  CHECK_THROWS(check_segment_header(header(0xffffffffu, 0), 128 * 1024, 0), "rank 0");
  CHECK_THROWS(check_segment_header(header(0, 0xffffffffu), 128 * 1024, 5), "rank 5");
}
