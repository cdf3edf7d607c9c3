// Fuzz target: the TCP handshake parser (tcp::GreetingReader, handshake.cpp),
// which reads the secret and the Hello of every connection, on the accepting
// side (accept_peers: a stranger may be at the other end) and on the dialling
// side (dial: the answer of the listener).
//
// Input: one byte picking who reads (the identities below) and one seeding
// the chunk sizes, then the bytes that arrive on the socket. The target feeds
// them to two readers: one the way the transport reads the socket (recv of
// at most want() bytes at a time, in chunks the seed draws), one in a single
// feed() of everything; both must reach the same verdict. Checked besides
// memory safety: nothing past the secret is taken before the secret was
// checked; a refused secret is refused exactly when its 32 bytes are in; a
// complete greeting is accepted only if it holds the secret and a Hello that
// fits the reader (rank, world, sender, geometry); nothing past the greeting
// is taken (the frames after it belong to the transport).
#include <cstring>
#include <string>

#include "fuzz/fuzz_common.h"
#include "fuzz/handshake_roles.h"
#include "transport/tcp/handshake.h"

namespace tcp = ringcomm::tcp;
using tcp::GreetingReader;
using fuzz::kRoles;
using fuzz::kNumRoles;
using fuzz::kSecret;

extern "C" int ringcomm_fuzz_handshake(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const fuzz::Role& role = kRoles[data[0] % kNumRoles];
  fuzz::Rng rng(data[1]);
  const uint8_t* in = data + 2;
  const size_t n = size - 2;

  // As the transport reads: never more than want() from the socket at once.
  GreetingReader socket_like(role.me, role.expect_from);
  size_t pos = 0;
  while (socket_like.status() == GreetingReader::kMore && pos < n) {
    const size_t want = socket_like.want();
    FUZZ_CHECK(want > 0 && want <= tcp::kGreetingBytes - socket_like.received());
    if (socket_like.received() < tcp::kSecretBytes) FUZZ_CHECK(want <= tcp::kSecretBytes - socket_like.received());
    size_t chunk = 1 + rng.next() % want;
    chunk = std::min(chunk, n - pos);
    size_t used = 0;
    const GreetingReader::Status s = socket_like.feed(in + pos, chunk, &used);
    FUZZ_CHECK(used == chunk);  // a chunk within want() is taken whole
    pos += used;
    if (s == GreetingReader::kBadSecret) FUZZ_CHECK(socket_like.received() == tcp::kSecretBytes);
  }
  FUZZ_CHECK(socket_like.received() <= tcp::kGreetingBytes);
  FUZZ_CHECK(socket_like.received() == std::min(n, pos));

  // All at once: the same verdict, and nothing past the greeting taken.
  GreetingReader at_once(role.me, role.expect_from);
  size_t used = 0;
  const GreetingReader::Status s = at_once.feed(in, n, &used);
  FUZZ_CHECK(s == socket_like.status());
  FUZZ_CHECK(used == socket_like.received());
  FUZZ_CHECK(at_once.want() == socket_like.want());
  FUZZ_CHECK(at_once.error() == socket_like.error());

  const bool secret_in = n >= tcp::kSecretBytes;
  const bool secret_ok = secret_in && std::memcmp(in, kSecret.data(), tcp::kSecretBytes) == 0;
  switch (s) {
    case GreetingReader::kMore:
      FUZZ_CHECK(n < tcp::kGreetingBytes && (!secret_in || secret_ok));
      FUZZ_CHECK(used == n);
      return 0;
    case GreetingReader::kBadSecret:
      FUZZ_CHECK(secret_in && !secret_ok && used == tcp::kSecretBytes && !at_once.authenticated());
      FUZZ_CHECK(at_once.want() == 0);
      return -1;
    case GreetingReader::kBadHello:
      FUZZ_CHECK(secret_ok && used == tcp::kGreetingBytes && !at_once.error().empty());
      return -2;
    case GreetingReader::kDone: {
      FUZZ_CHECK(secret_ok && used == tcp::kGreetingBytes && at_once.authenticated());
      const tcp::Hello& h = at_once.hello();
      FUZZ_CHECK(h.magic == tcp::kHelloMagic && h.version == tcp::kWireVersion);
      FUZZ_CHECK(h.frame_bytes == sizeof(tcp::FrameHeader));
      FUZZ_CHECK(h.to == role.me.rank && h.world == role.me.world);
      FUZZ_CHECK(h.from >= 0 && h.from < role.me.world && h.from != role.me.rank);
      if (role.expect_from >= 0) FUZZ_CHECK(h.from == role.expect_from);
      FUZZ_CHECK(h.slot_bytes == role.me.slot_bytes && h.nslots == static_cast<uint32_t>(role.me.nslots));
      // What that rank's encoder sends is what was accepted (the Hello has
      // no padding, so the bytes must match).
      tcp::Identity sender = role.me;
      sender.rank = h.from;
      char again[tcp::kGreetingBytes];
      tcp::encode_greeting(sender, role.me.rank, again);
      FUZZ_CHECK(std::memcmp(again, in, tcp::kGreetingBytes) == 0);
      return 1;
    }
  }
  return 0;
}

FUZZ_ENTRY(ringcomm_fuzz_handshake)
