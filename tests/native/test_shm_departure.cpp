// transport/shm: what a rank reads from a peer that closed its communicator
// (or died) after sending, and what it refuses. Two ranks' transports in one
// process, each mapping the other's inbox.
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "transport/shm/shm_transport.h"

using namespace ringcomm;

namespace {

struct Pair {
  ShmTransport t0{0, 2, 4096, 4}, t1{1, 2, 4096, 4};
  Pair() {
    const std::string n0 = t0.create_inbox({0, 1}), n1 = t1.create_inbox({0, 1});
    t0.connect({"", n1});
    t1.connect({n0, ""});
    t0.unlink();
    t1.unlink();
  }
};

void send(Link* l, uint64_t seq) {
  char* slot = l->send_slot(0, 8);
  CHECK(slot != nullptr);
  if (!slot) return;
  std::memcpy(slot, &seq, sizeof seq);
  MsgHeader h;
  h.tag.seq = seq;
  h.nbytes = sizeof seq;
  l->send_commit(h);
}

}  // namespace

NATIVE_TEST(shm_departure, what_a_departed_peer_sent_is_read_then_its_absence_raises) {
  Pair p;
  send(p.t1.link(0), 7);
  p.t1.announce_departure();
  Link* in = p.t0.link(1);
  const char* payload = nullptr;
  const MsgHeader* h = in->recv_peek(&payload);
  CHECK(h != nullptr);
  if (h) {
    CHECK_EQ(h->tag.seq, uint64_t{7});
    in->recv_release();
  }
  CHECK_THROWS(in->recv_peek(&payload), "rank 1 closed its communicator");
}

NATIVE_TEST(shm_departure, a_link_that_saw_nothing_looks_again_once_the_peer_is_seen_gone) {
  // The rule recv_peek and send_slot follow: a departure seen after an empty
  // look raises only if the FIFO is still as it was (the peer's last send
  // can land between the look and the sight of its departure); an abort
  // raises whatever arrived.
  Pair p;
  CHECK(!p.t0.check_gone(1, [] { return true; }));  // not gone: nothing raised, nothing to look at again
  p.t1.announce_departure();
  CHECK(p.t0.check_gone(1, [] { return false; }));  // something arrived meanwhile: look again, read it
  CHECK_THROWS(p.t0.check_gone(1, [] { return true; }), "rank 1 closed its communicator");
  Pair q;
  q.t1.announce_abort("rank 1: out of memory");
  CHECK_THROWS(q.t0.check_gone(1, [] { return false; }), "rank 1 aborted: rank 1: out of memory");
}

NATIVE_TEST(shm_departure, a_full_fifo_to_a_departed_peer_raises) {
  Pair p;
  Link* out = p.t0.link(1);
  for (uint64_t s = 1; s <= 4; ++s) send(out, s);
  p.t1.announce_departure();
  CHECK_THROWS(out->send_slot(0, 8), "rank 1 closed its communicator");
}
