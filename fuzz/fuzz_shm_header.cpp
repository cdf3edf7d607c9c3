// Fuzz target: the check of a segment header that a peer wrote into this
// rank's shared-memory inbox (check_segment_header, shm/segment_header.cpp),
// which ShmLink::recv_peek runs before it hands the payload to a schedule.
//
// Input: one byte picking the slot size (fuzz_common.h), one the peer's rank,
// then the MsgHeader as the peer left it in the slot (zero-padded when short).
// A slot of Segment::slot_stride(slot_bytes) bytes is allocated at exactly
// that size, the header is put in its first page, and a header that passes
// the check has its payload (slot + kPage + payload_offset, nbytes bytes)
// read and written, as the receiving schedule does: AddressSanitizer sees any
// byte of it outside the slot. A refused header must raise ringcomm::Error
// with the message recv_peek has always given.
#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz_common.h"
#include "ringcomm/types.h"
#include "transport/shm/segment.h"
#include "transport/shm/segment_header.h"

using ringcomm::MsgHeader;

extern "C" int ringcomm_fuzz_shm_header(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t slot_bytes = fuzz::kSlotSizes[data[0] % fuzz::kNumSlotSizes];
  const int peer = data[1];
  unsigned char bytes[sizeof(MsgHeader)] = {};
  std::memcpy(bytes, data + 2, std::min(size - 2, sizeof bytes));
  MsgHeader h;
  std::memcpy(&h, bytes, sizeof h);
  const size_t stride = ringcomm::Segment::slot_stride(slot_bytes);
  FUZZ_CHECK(stride >= ringcomm::kPage + sizeof h);
  std::unique_ptr<char[]> slot(new char[stride]);
  std::memcpy(slot.get(), &h, sizeof h);
  const MsgHeader* in_slot = reinterpret_cast<const MsgHeader*>(slot.get());
  try {
    ringcomm::check_segment_header(*in_slot, slot_bytes, peer);
  } catch (const ringcomm::Error& e) {
    FUZZ_CHECK(std::string(e.what()) == "ringcomm: corrupt segment header from rank " + std::to_string(peer));
    FUZZ_CHECK(uint64_t{h.payload_offset} + h.nbytes > ringcomm::slot_data_bytes(slot_bytes) ||
               h.nbytes > slot_bytes);
    return -1;
  }
  FUZZ_CHECK(uint64_t{h.payload_offset} + h.nbytes <= ringcomm::slot_data_bytes(slot_bytes) &&
             h.nbytes <= slot_bytes);
  char* payload = slot.get() + ringcomm::kPage + in_slot->payload_offset;
  std::memset(payload, 0x5a, in_slot->nbytes);
  unsigned sum = 0;
  for (size_t i = 0; i < in_slot->nbytes; i += 512) sum += static_cast<unsigned char>(payload[i]);
  if (in_slot->nbytes) sum += static_cast<unsigned char>(payload[in_slot->nbytes - 1]);
  FUZZ_CHECK(in_slot->nbytes == 0 || sum != 0);
  return 1;
}

FUZZ_ENTRY(ringcomm_fuzz_shm_header)
