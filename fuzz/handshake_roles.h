// Who reads the greeting in fuzz_handshake (the first input byte picks one);
// make_seeds.cpp encodes valid greetings for them.
#pragma once

#include <string>

#include "transport/tcp/handshake.h"

namespace fuzz {

inline const std::string kSecret = "ringcomm-fuzz-secret-0123456789!";  // tcp::kSecretBytes bytes
static_assert(ringcomm::tcp::kSecretBytes == 32, "kSecret has 32 bytes");

struct Role {
  ringcomm::tcp::Identity me;
  int expect_from;  // -1: accepting (any rank), else dialling that rank
};

inline const Role kRoles[] = {
    {{0, 2, 128 * 1024, 16, kSecret}, -1},  // rank 0 of 2 accepting
    {{1, 4, 4096, 3, kSecret}, -1},         // rank 1 of 4 accepting
    {{3, 4, 64, 4096, kSecret}, 1},         // rank 3 of 4 reading rank 1's answer
    {{2, 3, 1 << 20, 8, kSecret}, 0},       // rank 2 of 3 reading rank 0's answer
};
constexpr size_t kNumRoles = sizeof kRoles / sizeof kRoles[0];

}  // namespace fuzz
