// What travels on a ringcomm TCP connection, and the checks made on it.
//
// Setup (once per connection, both directions, the connecting rank first):
//   secret[kSecretBytes]   the communicator's random secret (from the store);
//                          the accepting rank reads exactly these bytes first
//                          and closes a connection that gets them wrong
//   Hello                  who is calling whom, with the geometry both must share
// Then a stream of frames, each a FrameHeader followed by `nbytes` payload
// bytes: DATA (one segment of a Link), ABORT (the sender failed; the payload
// is its reason; only CLOSE follows, when the aborted rank closes: an EOF
// after ABORT without it is a dead process), CLOSE (an orderly goodbye;
// nothing follows), and STATUS
// QUERY / STATUS REPORT (no payload: a rank that timed out asks what its peer
// was doing; the peer's I/O thread answers with its last calls, carried in
// the header's fields, see status_report).
//
// Both ends run the same build (the Hello checks the version and the frame
// size), so the structs travel as they are laid out in memory.
//
// Everything here is pure (bytes in, a struct or the reason for refusing it
// out): the transport parses what it reads with these functions and nothing
// else, and fuzz/ runs them under AddressSanitizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/link.h"
#include "transport/transport.h"  // CallRecordView

namespace ringcomm {
namespace tcp {

constexpr size_t kSecretBytes = 32;
constexpr uint64_t kHelloMagic = 0x31706374676e6972ULL;  // "ringtcp1" (little endian)
// 2: MsgTag carries the send/recv tag; 3: an aborted rank keeps its connections
// open and says goodbye (CLOSE) after its ABORT frame when it closes
constexpr uint32_t kWireVersion = 3;
constexpr uint32_t kFrameMagic = 0x46434e52;  // "RNCF"
constexpr uint32_t kMaxReasonBytes = 1024;    // ABORT payload, at most
constexpr uint32_t kMaxPayloadOffset = 4095;  // DATA payload starts within one page

struct Hello {
  uint64_t magic = kHelloMagic;
  uint32_t version = kWireVersion;
  uint32_t frame_bytes = 0;  // sizeof(FrameHeader) of the sender's build
  int32_t from = -1;         // the sender's rank
  int32_t to = -1;           // the rank the sender expects at the other end
  int32_t world = 0;
  uint32_t nslots = 0;
  uint64_t slot_bytes = 0;
};
static_assert(sizeof(Hello) == 40, "Hello is part of the wire format");

enum FrameType : uint8_t { kData = 1, kAbort = 2, kClose = 3, kStatusQuery = 4, kStatusReport = 5 };

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t type = kData;
  uint8_t pad[3] = {0, 0, 0};
  uint32_t nbytes = 0;          // payload bytes after this header
  uint32_t payload_offset = 0;  // DATA: where the sender placed the payload within a page
  uint64_t segment = 0;
  MsgTag tag;
};
static_assert(sizeof(FrameHeader) == 56, "FrameHeader is part of the wire format");

// Empty when `h` is a Hello that rank `me` of a `world`-rank communicator
// (with this geometry) accepts from `expect_from` (-1: any rank); otherwise
// what is wrong with it.
std::string check_hello(const Hello& h, int me, int world, int expect_from, size_t slot_bytes, int nslots);

// Empty when a frame header read from a socket may be acted on by a rank
// whose slots hold `slot_bytes`; otherwise what is wrong with it.
std::string check_frame(const FrameHeader& f, size_t slot_bytes);

// Bytes of one receive slot: a DATA payload of at most slot_bytes starts at
// offset payload_offset (<= kMaxPayloadOffset) within it, so a header that
// passed check_frame never points past its slot.
constexpr size_t kSlotPage = 4096;
inline size_t slot_stride(size_t slot_bytes) {
  return (slot_bytes + kSlotPage - 1) / kSlotPage * kSlotPage + kSlotPage;
}
static_assert(kMaxPayloadOffset < kSlotPage, "a payload must start within the slot's page of slack");

// The frame header that carries one segment (what TcpLink::send_commit queues).
FrameHeader data_frame(const MsgHeader& m, uint32_t payload_offset);
// The segment header a received data frame carries (data_frame's inverse).
MsgHeader data_header(const FrameHeader& f);
// An ABORT frame with its reason (cut to kMaxReasonBytes), or a CLOSE frame
// (the reason is ignored): header and payload, ready to send.
std::string control_frame(FrameType type, const std::string& reason = {});

// A STATUS QUERY frame, and the STATUS REPORT of a rank whose last collective
// and last point-to-point calls are `coll` and `p2p`; read_status_report
// gives them back (fields are only displayed, never used as sizes).
std::string status_query();
std::string status_report(const CallRecordView& coll, const CallRecordView& p2p);
void read_status_report(const FrameHeader& f, CallRecordView* coll, CallRecordView* p2p);

// Decodes the `n` bytes read from a socket as a frame header (n must be
// sizeof(FrameHeader)) for a rank whose slots hold `slot_bytes`. Empty and
// *out set when the header may be acted on; otherwise what is wrong with it
// (*out is then unspecified).
std::string decode_frame(const void* bytes, size_t n, size_t slot_bytes, FrameHeader* out);

// Constant-time comparison (a secret must not leak through timing).
bool same_secret(const char* a, const char* b);

}  // namespace tcp
}  // namespace ringcomm
