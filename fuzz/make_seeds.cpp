// Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/) with the
// encoders the transports use: tcp::encode_greeting, tcp::data_frame,
// tcp::control_frame, and MsgHeader as ShmLink::send_commit lays it out.
// Files named ok-* hold what a real peer sends (the target accepts them),
// bad-* a real message with one field broken (refused), more-* a message cut
// short (waiting for more). tests/test_tcp_hardening.py checks those verdicts.
//
//   make_seeds OUT_DIR      (fuzz/build.sh runs it on fuzz/corpus)
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "fuzz/handshake_roles.h"
#include "transport/link.h"
#include "transport/shm/segment_header.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/wire.h"

namespace tcp = ringcomm::tcp;
using ringcomm::MsgHeader;

namespace {

std::string out_dir;

void write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = out_dir + "/" + target;
  ::mkdir(out_dir.c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

template <class T>
std::string raw(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

char slot_index(size_t slot_bytes) {
  for (size_t i = 0; i < fuzz::kNumSlotSizes; ++i) {
    if (fuzz::kSlotSizes[i] == slot_bytes) return static_cast<char>(i);
  }
  std::fprintf(stderr, "make_seeds: no slot size %zu in fuzz_common.h\n", slot_bytes);
  std::exit(1);
}

MsgHeader segment(uint32_t nbytes, uint64_t seg) {
  MsgHeader m;
  m.tag.kind = 1;
  m.tag.dtype = 7;
  m.tag.redop = 0;
  m.tag.algo = 2;
  m.tag.root = -1;
  m.tag.seq = 42;
  m.tag.count = 100003;
  m.nbytes = nbytes;
  m.segment = seg;
  return m;
}

std::string data(const MsgHeader& m, uint32_t offset) {
  return raw(tcp::data_frame(m, offset)) + std::string(m.nbytes, '\x11');
}

// A frame whose header the sender made, with one field then overwritten.
std::string patched(std::string frame, size_t at, const void* v, size_t n) {
  std::memcpy(&frame[at], v, n);
  return frame;
}

std::string good_status_tail() { return data(segment(8, 0), 0); }

void frames() {
  const size_t def = 128 * 1024;
  const std::string d = std::string(1, slot_index(def));
  write("frame", "ok-data", d + data(segment(16, 0), 100));
  write("frame", "ok-data-empty", d + data(segment(0, 0), 0));
  write("frame", "ok-stream", d + data(segment(300, 0), 7) + data(segment(def, 1), 4095) +
                                  data(segment(1, 2), 0) + tcp::control_frame(tcp::kClose));
  write("frame", "ok-abort", d + tcp::control_frame(tcp::kAbort, "rank 1 aborted: fuzz seed"));
  write("frame", "ok-abort-longest", d + tcp::control_frame(tcp::kAbort, std::string(5000, 'r')));
  write("frame", "ok-close", d + tcp::control_frame(tcp::kClose));
  ringcomm::CallRecordView coll, p2p;
  coll.kind = 0;
  coll.state = 3;
  coll.seq = 41;
  p2p.p2p = 1;
  p2p.state = 2;
  p2p.peer = 3;
  p2p.seq = 7;
  write("frame", "ok-status", d + tcp::status_query() + tcp::status_report(coll, p2p) + good_status_tail());
  write("frame", "ok-tiny-slot-full", std::string(1, slot_index(64)) + data(segment(64, 0), 4095));
  write("frame", "ok-odd-slot", std::string(1, slot_index(4160)) + data(segment(4160, 3), 4095));
  write("frame", "more-truncated-payload", d + data(segment(1000, 0), 0).substr(0, sizeof(tcp::FrameHeader) + 10));

  const std::string good = data(segment(16, 0), 100);
  const uint32_t bad_magic = 0x46434e53, big = static_cast<uint32_t>(def + 1), off = 4096, huge = 0xffffffffu;
  const uint8_t bad_type = 9;
  write("frame", "bad-magic", d + patched(good, offsetof(tcp::FrameHeader, magic), &bad_magic, 4));
  write("frame", "bad-type", d + patched(good, offsetof(tcp::FrameHeader, type), &bad_type, 1));
  write("frame", "bad-oversized", d + patched(good, offsetof(tcp::FrameHeader, nbytes), &big, 4));
  write("frame", "bad-huge-length", d + patched(good, offsetof(tcp::FrameHeader, nbytes), &huge, 4));
  write("frame", "bad-offset", d + patched(good, offsetof(tcp::FrameHeader, payload_offset), &off, 4));
  const uint32_t long_reason = tcp::kMaxReasonBytes + 1, one = 1;
  write("frame", "bad-abort-too-long",
        d + patched(tcp::control_frame(tcp::kAbort, "x"), offsetof(tcp::FrameHeader, nbytes), &long_reason, 4));
  write("frame", "bad-close-with-payload",
        d + patched(tcp::control_frame(tcp::kClose), offsetof(tcp::FrameHeader, nbytes), &one, 4) + "x");
  write("frame", "bad-frame-after-close", d + tcp::control_frame(tcp::kClose) + good);
  write("frame", "bad-status-with-payload",
        d + patched(tcp::status_query(), offsetof(tcp::FrameHeader, nbytes), &one, 4) + "x");
  write("frame", "bad-not-a-frame", d + "GET / HTTP/1.0\r\n\r\n" + std::string(64, 'x'));
}

void handshakes() {
  for (size_t r = 0; r < fuzz::kNumRoles; ++r) {
    const fuzz::Role& role = fuzz::kRoles[r];
    const tcp::Identity& me = role.me;
    // A sender that this reader takes: the expected rank, or the next one.
    tcp::Identity from = me;
    from.rank = role.expect_from >= 0 ? role.expect_from : (me.rank + 1) % me.world;
    char g[tcp::kGreetingBytes];
    tcp::encode_greeting(from, me.rank, g);
    const std::string good(g, sizeof g);
    const std::string head = {static_cast<char>(r), static_cast<char>(17 * r + 3)};
    const std::string name = "-role" + std::to_string(r);
    auto field = [&](size_t hello_offset, const void* v, size_t n) {
      return head + patched(good, tcp::kSecretBytes + hello_offset, v, n);
    };
    write("handshake", "ok" + name, head + good);
    write("handshake", "ok-then-frames" + name, head + good + data(segment(16, 0), 0));
    write("handshake", "more-secret-only" + name, head + good.substr(0, tcp::kSecretBytes));
    write("handshake", "more-half-secret" + name, head + good.substr(0, 10));
    std::string wrong = good;
    wrong[5] ^= 1;
    write("handshake", "bad-secret" + name, head + wrong);
    write("handshake", "bad-secret-http" + name, head + "GET / HTTP/1.0\r\n\r\n" + std::string(64, 'x'));
    const uint64_t magic = 0x32706374676e6972ULL;
    const uint32_t version = tcp::kWireVersion + 1, frame_bytes = 40, nslots = static_cast<uint32_t>(me.nslots) + 1;
    const int32_t out_of_range = me.world, self = me.rank, minus = -1, world = me.world + 1;
    const int32_t other_to = (me.rank + 1) % me.world;
    const uint64_t slot_bytes = me.slot_bytes + 64, huge = ~0ULL;
    write("handshake", "bad-magic" + name, field(offsetof(tcp::Hello, magic), &magic, 8));
    write("handshake", "bad-version" + name, field(offsetof(tcp::Hello, version), &version, 4));
    write("handshake", "bad-frame-bytes" + name, field(offsetof(tcp::Hello, frame_bytes), &frame_bytes, 4));
    write("handshake", "bad-from-out-of-range" + name, field(offsetof(tcp::Hello, from), &out_of_range, 4));
    write("handshake", "bad-from-self" + name, field(offsetof(tcp::Hello, from), &self, 4));
    write("handshake", "bad-from-negative" + name, field(offsetof(tcp::Hello, from), &minus, 4));
    write("handshake", "bad-to" + name, field(offsetof(tcp::Hello, to), &other_to, 4));
    write("handshake", "bad-world" + name, field(offsetof(tcp::Hello, world), &world, 4));
    write("handshake", "bad-nslots" + name, field(offsetof(tcp::Hello, nslots), &nslots, 4));
    write("handshake", "bad-slot-bytes" + name, field(offsetof(tcp::Hello, slot_bytes), &slot_bytes, 8));
    write("handshake", "bad-slot-bytes-huge" + name, field(offsetof(tcp::Hello, slot_bytes), &huge, 8));
    if (role.expect_from >= 0) {
      // The answer of a rank other than the one dialled.
      int32_t other = (role.expect_from + 1) % me.world;
      if (other == me.rank) other = (other + 1) % me.world;
      write("handshake", "bad-unexpected-sender" + name, field(offsetof(tcp::Hello, from), &other, 4));
    }
  }
}

void shm_headers() {
  for (size_t slot : {size_t{64}, size_t{4096}, size_t{128 * 1024}}) {
    const std::string d = std::string(1, slot_index(slot)) + "\x02";
    const std::string name = "-" + std::to_string(slot);
    // As ShmLink::send_commit writes it: the caller's header, its page offset.
    MsgHeader h = segment(static_cast<uint32_t>(slot), 5);
    h.payload_offset = 4095;
    write("shm_header", "ok-full-slot" + name, d + raw(h));
    h.nbytes = 0;
    h.payload_offset = 0;
    write("shm_header", "ok-empty" + name, d + raw(h));
    h = segment(static_cast<uint32_t>(slot) + 1, 5);
    write("shm_header", "bad-oversized" + name, d + raw(h));
    // A payload moved past the first page (payload_offset_for), ending where the data area ends.
    const size_t data = ringcomm::slot_data_bytes(slot);
    h = segment(static_cast<uint32_t>(slot / 2), 5);
    h.payload_offset = static_cast<uint32_t>(data - slot / 2);
    write("shm_header", "ok-moved" + name, d + raw(h));
    h = segment(1, 5);
    h.payload_offset = static_cast<uint32_t>(data);  // one byte past the data area
    write("shm_header", "bad-offset" + name, d + raw(h));
    h.payload_offset = 0xffffffffu;
    h.nbytes = 0xffffffffu;
    write("shm_header", "bad-both" + name, d + raw(h));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 2;
  }
  out_dir = argv[1];
  frames();
  handshakes();
  shm_headers();
  return 0;
}
