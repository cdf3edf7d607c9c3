// transport/tcp/wire.h: decoding frame headers read from a socket, valid and
// corrupted, and the Hello check.
#include <cstring>
#include <string>

#include "check.h"
#include "transport/tcp/wire.h"

using namespace ringcomm;
using namespace ringcomm::tcp;

namespace {

constexpr size_t kSlot = 8192;

std::string bytes_of(const FrameHeader& f) { return std::string(reinterpret_cast<const char*>(&f), sizeof f); }

std::string decode(const std::string& b, FrameHeader* out, size_t slot = kSlot) {
  return decode_frame(b.data(), b.size(), slot, out);
}

FrameHeader data(uint32_t nbytes, uint32_t offset) {
  MsgHeader m;
  m.nbytes = nbytes;
  m.segment = 7;
  m.tag.seq = 42;
  m.tag.count = 1000;
  return data_frame(m, offset);
}

}  // namespace

NATIVE_TEST(wire, valid_frames_decode_to_what_was_encoded) {
  FrameHeader out;
  const FrameHeader d = data(kSlot, 4095);
  CHECK_EQ(decode(bytes_of(d), &out), std::string());
  CHECK_EQ(int(out.type), int(kData));
  CHECK_EQ(out.nbytes, kSlot);
  CHECK_EQ(out.payload_offset, 4095u);
  CHECK_EQ(out.segment, 7u);
  CHECK_EQ(out.tag.seq, 42u);
  CHECK_EQ(out.tag.count, 1000u);

  const std::string abort = control_frame(kAbort, "rank 3 failed");
  CHECK_EQ(abort.size(), sizeof(FrameHeader) + 13);
  CHECK_EQ(decode(abort.substr(0, sizeof(FrameHeader)), &out), std::string());
  CHECK_EQ(out.nbytes, 13u);
  CHECK_EQ(abort.substr(sizeof(FrameHeader)), std::string("rank 3 failed"));

  // Reasons are cut to kMaxReasonBytes; CLOSE carries none.
  CHECK_EQ(control_frame(kAbort, std::string(5000, 'x')).size(), sizeof(FrameHeader) + kMaxReasonBytes);
  CHECK_EQ(control_frame(kClose, "ignored").size(), sizeof(FrameHeader));
  CHECK_EQ(decode(control_frame(kClose), &out), std::string());
  CHECK_EQ(decode(status_query(), &out), std::string());
  CHECK_EQ(int(out.type), int(kStatusQuery));
}

NATIVE_TEST(wire, status_report_round_trips) {
  CallRecordView coll{}, p2p{}, c2{}, p2{};
  coll.kind = 3;
  coll.state = 2;
  coll.seq = 99;
  p2p.p2p = 1;
  p2p.state = 1;
  p2p.peer = 4;
  p2p.seq = 12;
  p2p.kind = 9;
  FrameHeader out;
  CHECK_EQ(decode(status_report(coll, p2p), &out), std::string());
  read_status_report(out, &c2, &p2);
  CHECK_EQ(int(c2.kind), 3);
  CHECK_EQ(int(c2.state), 2);
  CHECK_EQ(c2.seq, 99u);
  CHECK_EQ(int(p2.p2p), 1);
  CHECK_EQ(p2.peer, 4);
  CHECK_EQ(p2.seq, 12u);
  CHECK_EQ(int(p2.kind), 9);
}

NATIVE_TEST(wire, corrupted_frames_are_refused_with_the_reason) {
  FrameHeader out;
  std::string b = bytes_of(data(100, 0));
  // Wrong length.
  CHECK(decode(b.substr(0, sizeof(FrameHeader) - 1), &out).find("expected 56") != std::string::npos);
  CHECK(decode(b + "x", &out).find("57 bytes") != std::string::npos);
  // Magic.
  std::string m = b;
  m[0] ^= 0x5a;
  CHECK(decode(m, &out).find("bad frame magic") != std::string::npos);
  // Type.
  FrameHeader t = data(100, 0);
  t.type = 9;
  CHECK(decode(bytes_of(t), &out).find("unknown frame type 9") != std::string::npos);
  // A segment larger than the slot, a payload starting past the page.
  CHECK(decode(bytes_of(data(kSlot + 1, 0)), &out).find("larger than the 8192-byte slots") != std::string::npos);
  CHECK(decode(bytes_of(data(1, 4096)), &out).find("payload offset 4096") != std::string::npos);
  // Control frames with payloads they must not have.
  FrameHeader c;
  c.type = kClose;
  c.nbytes = 1;
  CHECK(decode(bytes_of(c), &out).find("goodbye frame with 1") != std::string::npos);
  c.type = kAbort;
  c.nbytes = kMaxReasonBytes + 1;
  CHECK(decode(bytes_of(c), &out).find("abort reason of 1025") != std::string::npos);
  c.type = kStatusReport;
  c.nbytes = 8;
  CHECK(decode(bytes_of(c), &out).find("status frame") != std::string::npos);
  // Every single-byte change of the magic or type is refused.
  for (size_t i = 0; i < 5; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string x = b;
      x[i] = static_cast<char>(x[i] ^ (1 << bit));
      FrameHeader o;
      if (i == 4 && (static_cast<uint8_t>(x[4]) >= kData && static_cast<uint8_t>(x[4]) <= kStatusReport)) {
        continue;  // another valid type
      }
      CHECK(!decode(x, &o).empty());
    }
  }
}

NATIVE_TEST(wire, hello_checks) {
  Hello h;
  h.frame_bytes = sizeof(FrameHeader);
  h.from = 1;
  h.to = 0;
  h.world = 3;
  h.nslots = 8;
  h.slot_bytes = kSlot;
  CHECK_EQ(check_hello(h, 0, 3, -1, kSlot, 8), std::string());
  CHECK_EQ(check_hello(h, 0, 3, 1, kSlot, 8), std::string());
  CHECK(check_hello(h, 0, 3, 2, kSlot, 8).find("expected rank 2") != std::string::npos);
  CHECK(check_hello(h, 2, 3, -1, kSlot, 8).find("addressed to rank 0") != std::string::npos);
  CHECK(check_hello(h, 0, 4, -1, kSlot, 8).find("world size 3") != std::string::npos);
  CHECK(check_hello(h, 0, 3, -1, kSlot, 16).find("slots of") != std::string::npos);
  Hello bad = h;
  bad.magic ^= 1;
  CHECK(check_hello(bad, 0, 3, -1, kSlot, 8).find("bad magic") != std::string::npos);
  bad = h;
  bad.version = kWireVersion + 1;
  CHECK(check_hello(bad, 0, 3, -1, kSlot, 8).find("wire version") != std::string::npos);
  bad = h;
  bad.from = 0;
  CHECK(check_hello(bad, 0, 3, -1, kSlot, 8).find("out of range") != std::string::npos);
}

NATIVE_TEST(wire, slot_stride_holds_any_accepted_payload) {
  for (size_t slot : {size_t{64}, size_t{4032}, size_t{4096}, size_t{4160}, size_t{128 * 1024}}) {
    CHECK_EQ(slot_stride(slot) % kSlotPage, 0u);
    CHECK(kMaxPayloadOffset + slot <= slot_stride(slot));
  }
}

NATIVE_TEST(wire, secrets_compare_in_full) {
  char a[kSecretBytes], b[kSecretBytes];
  std::memset(a, 7, sizeof a);
  std::memcpy(b, a, sizeof a);
  CHECK(same_secret(a, b));
  b[kSecretBytes - 1] ^= 1;
  CHECK(!same_secret(a, b));
}
