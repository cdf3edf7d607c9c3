#include "transport/tcp/handshake.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "transport/tcp/wire.h"

namespace ringcomm {
namespace tcp {

const std::string& handshake_grace_text() {
  static const std::string text = [] {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", std::chrono::duration<double>(kHandshakeGrace).count());
    return std::string(buf);
  }();
  return text;
}

void encode_greeting(const Identity& me, int to, char out[kGreetingBytes]) {
  Hello h;
  h.frame_bytes = sizeof(FrameHeader);
  h.from = me.rank;
  h.to = to;
  h.world = me.world;
  h.nslots = static_cast<uint32_t>(me.nslots);
  h.slot_bytes = me.slot_bytes;
  std::memset(out, 0, kSecretBytes);
  std::memcpy(out, me.secret.data(), std::min(me.secret.size(), kSecretBytes));
  std::memcpy(out + kSecretBytes, &h, sizeof h);
}

size_t GreetingReader::want() const {
  if (status_ != kMore) return 0;
  return got_ < kSecretBytes ? kSecretBytes - got_ : kGreetingBytes - got_;
}

GreetingReader::Status GreetingReader::feed(const void* data, size_t n, size_t* used) {
  const char* in = static_cast<const char*>(data);
  size_t taken = 0;
  while (status_ == kMore && taken < n) {
    const size_t take = std::min(n - taken, want());
    std::memcpy(buf_ + got_, in + taken, take);
    got_ += take;
    taken += take;
    if (got_ == kSecretBytes) {
      // The secret, checked before a byte of the Hello is looked at.
      if (me_->secret.size() != kSecretBytes || !same_secret(buf_, me_->secret.data())) {
        status_ = kBadSecret;
        error_ = "it did not present this communicator's secret";
      }
    } else if (got_ == kGreetingBytes) {
      std::memcpy(&hello_, buf_ + kSecretBytes, sizeof hello_);
      error_ = check_hello(hello_, me_->rank, me_->world, expect_from_, me_->slot_bytes, me_->nslots);
      status_ = error_.empty() ? kDone : kBadHello;
    }
  }
  if (used) *used = taken;
  return status_;
}

std::string AcceptStats::summary() const {
  std::string s;
  auto add = [&](uint64_t n, const std::string& what) {
    if (n) s += (s.empty() ? "" : ", ") + std::to_string(n) + " " + what;
  };
  add(bad_secret, "without the secret");
  add(bad_hello, "with a bad handshake");
  add(timed_out, "without a complete handshake within " + handshake_grace_text() + " s");
  add(evicted, "dropped to keep at most " + std::to_string(kMaxPending) + " waiting");
  add(hung_up, "closed before completing the handshake");
  return s;
}

}  // namespace tcp
}  // namespace ringcomm
