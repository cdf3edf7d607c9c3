// Bulk copies out of the transport's slots into large user buffers.
#pragma once

#include <cstddef>

namespace ringcomm {

// Copies n bytes with non-temporal stores (x86: around the caches, no read
// of the destination's lines first), then fences. For destinations far larger
// than the caches: a plain copy reads every destination line before writing it
// (a third of the memory traffic) and evicts the slots being copied from.
// Elsewhere the same as memcpy. dst and src must not overlap.
void copy_streaming(void* dst, const void* src, size_t n);

// Messages at least this large are copied out with copy_streaming.
constexpr size_t kStreamingCopyMinBytes = size_t{8} << 20;

}  // namespace ringcomm
