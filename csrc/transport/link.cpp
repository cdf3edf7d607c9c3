#include "transport/link.h"

#include "ringcomm/types.h"

namespace ringcomm {

void Link::read_remote(void*, uint64_t, size_t) {
  throw Error("ringcomm: this transport cannot read a peer's memory directly");
}

uint64_t Link::send_ref(const char*, const MsgHeader&) {
  throw Error("ringcomm: this transport sends every segment from its own slots");
}

void Link::ack_pull(uint64_t) { throw Error("ringcomm: this transport has no pull acknowledgements (single-copy sends need a link that reads a peer's memory)"); }

uint64_t Link::pulled() { throw Error("ringcomm: this transport has no pull acknowledgements (single-copy sends need a link that reads a peer's memory)"); }

}  // namespace ringcomm
