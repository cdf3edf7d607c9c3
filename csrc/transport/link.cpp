#include "transport/link.h"

#include "ringcomm/types.h"

namespace ringcomm {

namespace {

// Copies n bytes (streamed: around the caches).
void copy_bytes(char* dst, const char* src, size_t n, bool streamed) {
  if (streamed) {
    copy_streaming(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace

void Link::fill_slot(char* slot, const char* src, size_t n) {
  if (n == 0) return;
  const bool streamed = stream_slot(n);
  const bool timed = time_fill(n);
  const double seconds = run_timed(timed, [&] { copy_bytes(slot, src, n, streamed); });
  if (timed) filled(n, seconds);
}

void Link::copy_out(char* dst, const char* payload, size_t n, bool streaming) {
  if (n == 0) return;
  read_payload(n, [&] { copy_bytes(dst, payload, n, streaming); });
}

void Link::read_remote(void*, uint64_t, size_t) {
  throw Error("ringcomm: this transport cannot read a peer's memory directly");
}

uint64_t Link::send_ref(const char*, const MsgHeader&) {
  throw Error("ringcomm: this transport sends every segment from its own slots");
}

void Link::ack_pull(uint64_t) { throw Error("ringcomm: this transport has no pull acknowledgements (single-copy sends need a link that reads a peer's memory)"); }

uint64_t Link::pulled() { throw Error("ringcomm: this transport has no pull acknowledgements (single-copy sends need a link that reads a peer's memory)"); }

}  // namespace ringcomm
