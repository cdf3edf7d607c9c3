// Which schedule family each collective runs: RINGCOMM_ALGO / init(algo=)
// parsed once, when the communicator is made, into one choice per op.
//
//   "auto"                              every op picks by size (comm/communicator.cpp plan)
//   "<name>"                            every op that has <name> runs it; the others pick
//   "<op>:<name>,<op>:<name>,..."       each named op forced, the others pick
//
// The names, and the ops that have each (algo_has): docs/algorithms.md, "Algorithm names".
#pragma once

#include <array>
#include <string>

#include "comm/describe.h"

namespace ringcomm {

enum class Algo : uint8_t {
  kAuto,
  kRing,
  kOneShot,
  kPull,
  kRecursiveDoubling,
  kTree,
  kRabenseifner,
  kBruck,
  kHierarchical,
  kDirect,
  // GPU only (comm/chooser.h): NCCL's own collective, and cuda_ipc's
  // two-shot all_reduce (kOneShot is also cuda_ipc's one-shot protocol).
  kNccl,
  kTwoShot,
};
constexpr int kNumOpKinds = static_cast<int>(OpKind::kBarrier) + 1;

struct AlgoChoice {
  std::array<Algo, kNumOpKinds> by_op{};  // kAuto everywhere by default
  Algo of(OpKind k) const { return by_op[static_cast<int>(k)]; }
  bool forces_pull_everywhere = false;    // the single name "pull" (send/recv too)
};

// Throws ValueError naming what is wrong (an unknown name or op, a name the op lacks).
AlgoChoice parse_algo_choice(const std::string& text);
// Any algorithm's name (every device's: algo_name spells them); false if unknown.
bool parse_algo_name(const std::string& name, Algo* out);
const char* algo_name(Algo a);
// The family op `k` runs when nothing else is chosen: kRing (all_reduce,
// reduce_scatter, all_gather; the chain for broadcast and reduce), kDirect
// (scatter, gather, all_to_all, barrier).
Algo default_algo(OpKind k);
// Whether op `k` has a schedule of family `a`.
bool algo_has(OpKind k, Algo a);

}  // namespace ringcomm
