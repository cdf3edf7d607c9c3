// How a shared-memory writer stores its slots' payloads (Link::fill_slot,
// ShmLink): cached stores, or non-temporal ones that go around the caches.
//
// On some placements of a VM's cores, moving lines between the two cores'
// caches (the writer's stores to lines the reader last held, the reader's
// loads of lines the writer's cache still holds modified) runs 3-5x slower
// than going through memory (a 2-rank all_gather of 2 MiB: 540-610 us against
// 100-130 us on the same host a minute later, an AMD EPYC VM). Non-temporal
// stores avoid it, at the cost of the shared cache's speed where the cores
// have one (the same all_gather: 145 us streamed against 105 cached). Which
// placement a run gets is not visible from the guest, and changes over time,
// so "auto" measures: the writer streams where the slots' whole trip (its
// fill plus the reader's copy out) is cheaper that way.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ringcomm {

enum class SlotStoreMode : uint8_t { kAuto, kCached, kStreamed };

// "auto", "cached" or "streamed"; throws ValueError otherwise.
SlotStoreMode parse_slot_stores(const std::string& name);

// The rule of "auto", kept apart from the link so that tests can drive it.
struct SlotStoreRule {
  // A switch needs the other way at under this share of the current way's cost.
  static constexpr double kSwitch = 0.7;
  // Samples of a way each end takes before its cost counts (the first fills
  // of a fresh slot, still cold, cost more than the rest).
  static constexpr int kMinSamples = 8;

  // A moving average of a cost (1/8 of each sample); a sample over 4x the
  // average counts as 4x, so a preempted copy moves the average, not the
  // choice. 0: nothing measured yet.
  static void average(double* avg, double sample) {
    if (*avg > 0) {
      *avg += ((sample < 4 * *avg ? sample : 4 * *avg) - *avg) / 8;
    } else {
      *avg = sample;
    }
  }

  // Whether the writer streams from now on, given whether it streams now and
  // the costs (seconds per byte) of filling slots and of copying out of them,
  // [0] cached, [1] streamed (0: not measured yet: no switch).
  static bool choose(bool streaming, const double write_cost[2], const double read_cost[2]) {
    for (int i = 0; i < 2; ++i) {
      if (!(write_cost[i] > 0) || !(read_cost[i] > 0)) return streaming;
    }
    const double cached = write_cost[0] + read_cost[0], streamed = write_cost[1] + read_cost[1];
    return streaming ? !(cached < kSwitch * streamed) : streamed < kSwitch * cached;
  }

  // A cost the peer published in shared memory (the bits of a double):
  // anything that is not a finite positive number counts as not measured.
  static double cost_from_bits(uint64_t bits) {
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v > 0 && v < 1.0 ? v : 0;  // (seconds per byte: far under 1)
  }
  static uint64_t bits_of(double cost) {
    uint64_t bits;
    std::memcpy(&bits, &cost, sizeof bits);
    return bits;
  }
};

}  // namespace ringcomm
