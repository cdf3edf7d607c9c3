#include "ringcomm/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: part of x86-64, no run-time check needed
#endif

namespace ringcomm {

void copy_streaming(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  // Head: up to the destination's next 16-byte boundary.
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  // Unaligned loads cost the same as aligned ones on every x86-64 core since
  // Nehalem / Bulldozer, so one loop serves any source offset.
  for (size_t blocks = n / 64; blocks; --blocks, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n % 64);
  // Non-temporal stores are weakly ordered: make them visible before anything
  // this thread publishes afterwards (completion flags, slot releases).
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace ringcomm

