// Shared by the fuzz targets (fuzz/README.md): the slot sizes they try, a
// failure that every build reports (also without sanitizers), and the entry
// point libFuzzer calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace fuzz {

// Slot sizes a communicator may run with (RINGCOMM_SLOT_BYTES: multiples of
// 64 from 64 to 1 GiB; 128 KiB by default). The first input byte picks one.
constexpr size_t kSlotSizes[] = {64, 256, 4032, 4096, 4160, 128 * 1024, 1 << 20};
constexpr size_t kNumSlotSizes = sizeof kSlotSizes / sizeof kSlotSizes[0];

[[noreturn]] inline void fail(const char* what, const char* file, int line) {
  std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n", file, line, what);
  std::abort();
}

// A tiny deterministic generator (xorshift), for chunk sizes drawn from the input.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ULL + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

}  // namespace fuzz

#define FUZZ_CHECK(cond)                                  \
  do {                                                    \
    if (!(cond)) fuzz::fail(#cond, __FILE__, __LINE__);   \
  } while (0)

// Each target defines `extern "C" int NAME(const uint8_t*, size_t)` (its
// verdict: > 0 accepted, 0 incomplete, < 0 refused, for tests) and, unless
// RINGCOMM_FUZZ_NO_MAIN is defined (tests/test_tcp_hardening.py links every
// target into one library), the libFuzzer entry point calling it.
#ifdef RINGCOMM_FUZZ_NO_MAIN
#define FUZZ_ENTRY(fn)
#else
#define FUZZ_ENTRY(fn)                                                    \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    fn(data, size);                                                       \
    return 0;                                                             \
  }
#endif
