// algo/blocks.h: how schedules cut a buffer into blocks and slices.
#include <cstddef>

#include "algo/blocks.h"
#include "check.h"

using ringcomm::Range;

NATIVE_TEST(blocks, ring_blocks_tile_the_buffer) {
  // For every count and world: blocks are contiguous, in order, cover
  // [0, count) exactly, and differ in size by at most one (larger first).
  for (size_t count = 0; count <= 40; ++count) {
    for (int n = 1; n <= 9; ++n) {
      size_t next = 0, first = ringcomm::ring_block(count, n, 0).count;
      for (int i = 0; i < n; ++i) {
        const Range b = ringcomm::ring_block(count, n, i);
        CHECK_EQ(b.offset, next);
        CHECK(b.count == count / n || b.count == count / n + 1);
        CHECK(b.count <= first);
        CHECK_EQ(b.count, count / n + (static_cast<size_t>(i) < count % n ? 1 : 0));
        next = b.offset + b.count;
      }
      CHECK_EQ(next, count);
    }
  }
}

NATIVE_TEST(blocks, ring_block_examples) {
  CHECK_EQ(ringcomm::ring_block(10, 3, 0).offset, 0u);
  CHECK_EQ(ringcomm::ring_block(10, 3, 0).count, 4u);
  CHECK_EQ(ringcomm::ring_block(10, 3, 1).offset, 4u);
  CHECK_EQ(ringcomm::ring_block(10, 3, 1).count, 3u);
  CHECK_EQ(ringcomm::ring_block(10, 3, 2).offset, 7u);
  CHECK_EQ(ringcomm::ring_block(10, 3, 2).count, 3u);
  CHECK_EQ(ringcomm::ring_block(2, 4, 3).offset, 2u);  // more ranks than elements: empty blocks at the end
  CHECK_EQ(ringcomm::ring_block(2, 4, 3).count, 0u);
}

NATIVE_TEST(blocks, slices_cover_a_block_in_rounds_for_rounds) {
  for (size_t count = 0; count <= 30; ++count) {
    for (size_t slice = 1; slice <= 7; ++slice) {
      const Range block{100, count};
      const size_t rounds = ringcomm::rounds_for(count, slice);
      CHECK(rounds >= 1);
      size_t next = block.offset;
      for (size_t k = 0; k < rounds; ++k) {
        const Range s = ringcomm::slice_of(block, slice, k);
        CHECK_EQ(s.offset, next);
        CHECK(s.count <= slice);
        // Every round but the last moves a full slice.
        if (k + 1 < rounds) CHECK_EQ(s.count, slice);
        next = s.offset + s.count;
      }
      CHECK_EQ(next, block.offset + count);
      // Past the end: empty, at the block's end.
      const Range past = ringcomm::slice_of(block, slice, rounds + 2);
      CHECK_EQ(past.count, 0u);
      CHECK_EQ(past.offset, block.offset + count);
    }
  }
  CHECK_EQ(ringcomm::rounds_for(0, 8), 1u);  // empty calls still exchange headers
  CHECK_EQ(ringcomm::rounds_for(8, 8), 1u);
  CHECK_EQ(ringcomm::rounds_for(9, 8), 2u);
}

NATIVE_TEST(blocks, mod_is_never_negative) {
  CHECK_EQ(ringcomm::mod(-1, 5), 4);
  CHECK_EQ(ringcomm::mod(-6, 5), 4);
  CHECK_EQ(ringcomm::mod(7, 5), 2);
  CHECK_EQ(ringcomm::mod(0, 1), 0);
}
