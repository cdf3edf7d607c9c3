// Fuzz target: the TCP frame header decoder (tcp::decode_frame, wire.cpp),
// which TcpTransport::pump_in runs on every header read from a peer.
//
// Input: one byte picking the slot size (fuzz_common.h), then the byte stream
// a connected peer sends. Like pump_in, the target decodes a header, then
// writes the payload where the transport would (DATA: at payload_offset into
// a slot of tcp::slot_stride(slot_bytes) bytes, allocated at exactly that size
// so that AddressSanitizer sees any write past it; ABORT: into a reason
// buffer of nbytes), and goes on with the next header; a refused header ends
// the stream (the transport hangs up). Checked besides memory safety: what
// decode_frame accepts is within the documented limits, and re-encoding an
// accepted DATA header (tcp::data_frame, what the sender uses) decodes to
// the same fields.
#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz_common.h"
#include "transport/tcp/wire.h"

using ringcomm::MsgHeader;
using ringcomm::tcp::FrameHeader;
namespace tcp = ringcomm::tcp;

// Verdict: the number of complete frames; 0 when the stream ends within a
// frame (or holds none); -1 when a header was refused.
extern "C" int ringcomm_fuzz_frame(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t slot_bytes = fuzz::kSlotSizes[data[0] % fuzz::kNumSlotSizes];
  const uint8_t* p = data + 1;
  size_t left = size - 1;
  const size_t stride = tcp::slot_stride(slot_bytes);
  std::unique_ptr<char[]> slot;  // allocated at the first DATA frame
  int frames = 0;
  bool closed = false;
  while (left > 0) {
    if (left < sizeof(FrameHeader)) return 0;  // ends within a header: the transport waits for more
    FrameHeader f;
    const std::string why = tcp::decode_frame(p, sizeof(FrameHeader), slot_bytes, &f);
    p += sizeof(FrameHeader);
    left -= sizeof(FrameHeader);
    if (!why.empty()) return -1;
    if (closed) return -1;  // pump_in refuses any frame after the goodbye
    FUZZ_CHECK(f.magic == tcp::kFrameMagic);
    const size_t take = std::min<size_t>(left, f.nbytes);
    switch (f.type) {
      case tcp::kData: {
        FUZZ_CHECK(f.nbytes <= slot_bytes);
        FUZZ_CHECK(f.payload_offset <= tcp::kMaxPayloadOffset);
        FUZZ_CHECK(size_t{f.payload_offset} + f.nbytes <= stride);
        if (!slot) slot.reset(new char[stride]);
        char* dst = slot.get() + f.payload_offset;
        std::memset(dst, 0, f.nbytes);  // the payload's whole extent, as recv would fill it
        std::memcpy(dst, p, take);
        // What the sender encodes for this segment decodes to the same header.
        MsgHeader m;
        m.tag = f.tag;
        m.nbytes = f.nbytes;
        m.segment = f.segment;
        const FrameHeader again = tcp::data_frame(m, f.payload_offset);
        FrameHeader back;
        FUZZ_CHECK(tcp::decode_frame(&again, sizeof again, slot_bytes, &back).empty());
        FUZZ_CHECK(back.nbytes == f.nbytes && back.payload_offset == f.payload_offset &&
                   back.segment == f.segment && back.tag == f.tag && back.type == tcp::kData);
        break;
      }
      case tcp::kAbort: {
        FUZZ_CHECK(f.nbytes <= tcp::kMaxReasonBytes);
        std::string reason(f.nbytes, '\0');
        std::memcpy(&reason[0], p, take);
        // The sender's encoder makes a frame that decodes to the same length.
        const std::string again = tcp::control_frame(tcp::kAbort, reason);
        FrameHeader back;
        FUZZ_CHECK(again.size() == sizeof(FrameHeader) + reason.size());
        FUZZ_CHECK(tcp::decode_frame(again.data(), sizeof(FrameHeader), slot_bytes, &back).empty());
        FUZZ_CHECK(back.type == tcp::kAbort && back.nbytes == f.nbytes);
        break;
      }
      case tcp::kClose:
        FUZZ_CHECK(f.nbytes == 0);
        closed = true;
        break;
      case tcp::kStatusQuery:
        FUZZ_CHECK(f.nbytes == 0);
        break;
      case tcp::kStatusReport: {
        FUZZ_CHECK(f.nbytes == 0);
        // Whatever its fields, a report reads back and re-encodes to the same fields.
        ringcomm::CallRecordView coll, p2p, coll2, p2p2;
        tcp::read_status_report(f, &coll, &p2p);
        const std::string again = tcp::status_report(coll, p2p);
        FrameHeader back;
        FUZZ_CHECK(tcp::decode_frame(again.data(), sizeof(FrameHeader), slot_bytes, &back).empty());
        tcp::read_status_report(back, &coll2, &p2p2);
        FUZZ_CHECK(coll2.kind == coll.kind && coll2.state == coll.state && coll2.seq == coll.seq);
        FUZZ_CHECK(p2p2.p2p == p2p.p2p && p2p2.state == p2p.state && p2p2.peer == p2p.peer && p2p2.seq == p2p.seq);
        break;
      }
      default:
        FUZZ_CHECK(!"decode_frame accepted an unknown frame type");
    }
    if (take < f.nbytes) return 0;  // the payload is still on its way
    p += take;
    left -= take;
    ++frames;
  }
  return frames;
}

FUZZ_ENTRY(ringcomm_fuzz_frame)
