// Pure arithmetic of how schedules cut buffers. No I/O: unit-testable alone.
#pragma once

#include <cstddef>

namespace ringcomm {

// Element range [offset, offset + count).
struct Range {
  size_t offset;
  size_t count;
};

// Block i of `count` elements cut into n nearly equal blocks: the first
// count % n blocks hold one element more, so sizes differ by at most one.
inline Range ring_block(size_t count, int n, int i) {
  size_t base = count / n, extra = count % n, ui = static_cast<size_t>(i);
  return {ui * base + (ui < extra ? ui : extra), base + (ui < extra ? 1 : 0)};
}

// The part of `block` that round `round` moves when each round moves at most
// `slice` elements of every block (empty once the block is exhausted).
inline Range slice_of(Range block, size_t slice, size_t round) {
  size_t begin = round * slice;
  if (begin >= block.count) return {block.offset + block.count, 0};
  size_t n = block.count - begin;
  return {block.offset + begin, n < slice ? n : slice};
}

// Rounds needed so that every block of at most `max_count` elements is moved
// in slices of `slice` elements (at least one round, so empty calls still
// exchange headers).
inline size_t rounds_for(size_t max_count, size_t slice) {
  return max_count == 0 ? 1 : (max_count + slice - 1) / slice;
}

inline int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace ringcomm
