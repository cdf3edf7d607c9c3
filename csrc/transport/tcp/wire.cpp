#include "transport/tcp/wire.h"

#include <algorithm>
#include <cstring>

#include "ringcomm/text.h"

namespace ringcomm {
namespace tcp {
namespace {

std::string num(uint64_t v) { return std::to_string(v); }

std::string hex32(uint32_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 28; i >= 0; i -= 4) s += digits[(v >> i) & 15];
  return s;
}

}  // namespace

std::string check_hello(const Hello& h, int me, int world, int expect_from, size_t slot_bytes, int nslots) {
  if (h.magic != kHelloMagic) return "not a ringcomm connection (bad magic)";
  if (h.version != kWireVersion || h.frame_bytes != sizeof(FrameHeader)) {
    return "wire version " + num(h.version) + " / frame size " + num(h.frame_bytes) + ", expected " +
           num(kWireVersion) + " / " + num(sizeof(FrameHeader)) + " (a different ringcomm build?)";
  }
  const std::string from = std::to_string(h.from);
  if (h.world != world) return "world size " + std::to_string(h.world) + ", expected " + std::to_string(world);
  if (h.to != me) return "addressed to rank " + std::to_string(h.to) + ", this is rank " + std::to_string(me);
  if (h.from < 0 || h.from >= world || h.from == me) return "from rank " + from + ", out of range";
  if (expect_from >= 0 && h.from != expect_from) {
    return "from rank " + from + ", expected rank " + std::to_string(expect_from);
  }
  if (h.slot_bytes != slot_bytes || h.nslots != static_cast<uint32_t>(nslots)) {
    return "slots of " + num(h.slot_bytes) + " bytes x " + num(h.nslots) + ", expected " + num(slot_bytes) +
           " x " + num(static_cast<uint64_t>(nslots));
  }
  return {};
}

std::string check_frame(const FrameHeader& f, size_t slot_bytes) {
  if (f.magic != kFrameMagic) return "bad frame magic " + hex32(f.magic) + " (not a ringcomm frame)";
  switch (f.type) {
    case kData:
      if (f.nbytes > slot_bytes) {
        return "a segment of " + num(f.nbytes) + " bytes, larger than the " + num(slot_bytes) + "-byte slots";
      }
      if (f.payload_offset > kMaxPayloadOffset) return "payload offset " + num(f.payload_offset) + " > 4095";
      return {};
    case kAbort:
      if (f.nbytes > kMaxReasonBytes) return "an abort reason of " + num(f.nbytes) + " bytes (at most 1024)";
      return {};
    case kClose:
      if (f.nbytes != 0) return "a goodbye frame with " + num(f.nbytes) + " payload bytes";
      return {};
    case kStatusQuery:
    case kStatusReport:
      if (f.nbytes != 0) return "a status frame with " + num(f.nbytes) + " payload bytes";
      return {};
    default:
      return "unknown frame type " + num(f.type);
  }
}

FrameHeader data_frame(const MsgHeader& m, uint32_t payload_offset) {
  FrameHeader f;
  f.type = kData;
  f.nbytes = m.nbytes;
  f.payload_offset = payload_offset;
  f.segment = m.segment;
  f.tag = m.tag;
  return f;
}

MsgHeader data_header(const FrameHeader& f) {
  MsgHeader m;
  m.tag = f.tag;
  m.nbytes = f.nbytes;
  m.payload_offset = f.payload_offset;
  m.segment = f.segment;
  return m;
}

std::string status_query() {
  FrameHeader f;
  f.type = kStatusQuery;
  return std::string(reinterpret_cast<const char*>(&f), sizeof f);
}

// The report's fields: tag.kind / tag.redop / segment: the last collective's
// kind, state and seq; tag.algo / tag.dtype / tag.root / tag.count: the last
// point-to-point call's direction, state, peer and seq.
std::string status_report(const CallRecordView& coll, const CallRecordView& p2p) {
  FrameHeader f;
  f.type = kStatusReport;
  f.tag.kind = coll.kind;
  f.tag.redop = coll.state;
  f.segment = coll.seq;
  f.tag.algo = p2p.p2p;
  f.tag.dtype = p2p.state;
  f.tag.root = p2p.peer;
  f.tag.count = p2p.seq;
  f.payload_offset = p2p.kind;
  return std::string(reinterpret_cast<const char*>(&f), sizeof f);
}

void read_status_report(const FrameHeader& f, CallRecordView* coll, CallRecordView* p2p) {
  *coll = CallRecordView{};
  coll->kind = f.tag.kind;
  coll->state = f.tag.redop;
  coll->seq = f.segment;
  *p2p = CallRecordView{};
  p2p->p2p = f.tag.algo;
  p2p->state = f.tag.dtype;
  p2p->peer = f.tag.root;
  p2p->seq = f.tag.count;
  p2p->kind = static_cast<uint8_t>(f.payload_offset);
}

std::string control_frame(FrameType type, const std::string& reason) {
  FrameHeader f;
  f.type = type;
  const size_t n = type == kAbort ? utf8_cut(reason, kMaxReasonBytes) : 0;
  f.nbytes = static_cast<uint32_t>(n);
  std::string out(reinterpret_cast<const char*>(&f), sizeof f);
  out.append(reason, 0, n);
  return out;
}

std::string decode_frame(const void* bytes, size_t n, size_t slot_bytes, FrameHeader* out) {
  if (n != sizeof(FrameHeader)) {
    return "a frame header of " + num(n) + " bytes, expected " + num(sizeof(FrameHeader));
  }
  std::memcpy(out, bytes, sizeof(FrameHeader));
  return check_frame(*out, slot_bytes);
}

bool same_secret(const char* a, const char* b) {
  unsigned char diff = 0;
  for (size_t i = 0; i < kSecretBytes; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace tcp
}  // namespace ringcomm
