// The TCP handshake: on a new connection each side presents the secret and a
// Hello (wire.h) and checks the other's before the connection is used; the
// dialling rank speaks first. connector.h decides who dials and drives the
// sockets.
//
// What a stranger can cost a listening rank (docs/security.md): the
// listener is open from listen() until every TCP peer has joined (links are
// set up on demand, so that may be long after init); every connection gets
// kHandshakeGrace from its accept to complete its greeting, at most
// kMaxPending connections wait for theirs at once (the oldest
// unauthenticated one is dropped to make room), and all of them are read
// without blocking from one loop, so a slow or silent connection never
// delays another. A wrong secret or a bad Hello is dropped as soon as it is
// read.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/tcp/socket.h"
#include "transport/tcp/wire.h"

namespace ringcomm {
namespace tcp {

struct Identity {
  int rank;
  int world;
  size_t slot_bytes;
  int nslots;
  std::string secret;  // kSecretBytes bytes
};

// A real peer writes its whole greeting (72 bytes) right after its connect()
// completes, so it arrives within one round trip of the accept; 2 s also
// covers a lost segment (Linux retransmits after ~1 s at worst on a fresh
// connection) and a dialer descheduled on an overloaded host. A dialer whose
// connection is dropped anyway tries again (kDialAttempts).
constexpr auto kHandshakeGrace = std::chrono::seconds(2);
// kHandshakeGrace in seconds, for messages ("2").
const std::string& handshake_grace_text();
// Connections accepted but not yet through their greeting. A stranger can
// hold a slot for kHandshakeGrace at most, and a new connection evicts the
// oldest unauthenticated one, so locking a real peer out takes opening
// kMaxPending connections within the moment between its connect and the
// arrival of its greeting; 64 keeps the poll set (and the descriptors) small.
constexpr size_t kMaxPending = 64;
// Connections accepted per turn of the loop before the pending ones are read
// again (a flood in the accept queue does not starve the greetings in hand).
constexpr int kAcceptBurst = 32;
// How often a dialer connects again when the listener closed its connection
// before answering (evicted or timed out in a flood of strangers).
constexpr int kDialAttempts = 4;

constexpr size_t kGreetingBytes = kSecretBytes + sizeof(Hello);

// What rank me.rank sends first on a connection to rank `to`: the secret,
// then its Hello.
void encode_greeting(const Identity& me, int to, char out[kGreetingBytes]);

// The greeting of one connection, parsed as its bytes arrive (pure: no
// socket I/O). The secret is checked as soon as its kSecretBytes bytes are
// in, before any byte of the Hello is looked at.
class GreetingReader {
 public:
  enum Status { kMore, kDone, kBadSecret, kBadHello };

  // Checks a greeting sent to rank me.rank by `expect_from` (-1: any rank).
  GreetingReader(const Identity& me, int expect_from) : me_(&me), expect_from_(expect_from) {}

  // Bytes to read next: never past the end of the secret (until it has been
  // checked) nor past the greeting; 0 once the reader is done or failed.
  size_t want() const;
  // Takes up to want() bytes of `data`; *used (if given) gets how many.
  Status feed(const void* data, size_t n, size_t* used = nullptr);

  Status status() const { return status_; }
  bool authenticated() const { return got_ >= kSecretBytes && status_ != kBadSecret; }
  size_t received() const { return got_; }
  const Hello& hello() const { return hello_; }  // valid when kDone
  const std::string& error() const { return error_; }

 private:
  const Identity* me_;
  int expect_from_;
  Status status_ = kMore;
  size_t got_ = 0;
  char buf_[kGreetingBytes] = {};
  Hello hello_;
  std::string error_;
};

// What a listener turned away, by reason.
struct AcceptStats {
  uint64_t accepted = 0;     // every connection accepted, peers included
  uint64_t bad_secret = 0;   // presented something other than the secret
  uint64_t bad_hello = 0;    // the secret, then a Hello this rank does not take
  uint64_t timed_out = 0;    // no complete greeting within kHandshakeGrace
  uint64_t evicted = 0;      // dropped to keep at most kMaxPending waiting
  uint64_t hung_up = 0;      // closed (or failed) before completing its greeting
  uint64_t superseded = 0;   // a real peer's dial, crossed by this (lower) rank's own (not a stranger)
  uint64_t turned_away() const { return bad_secret + bad_hello + timed_out + evicted + hung_up; }
  // "3 wrong secret, 150 no greeting within 2 s, ..." (the non-zero counts).
  std::string summary() const;
};

}  // namespace tcp
}  // namespace ringcomm
