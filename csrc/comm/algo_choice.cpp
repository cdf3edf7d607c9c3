#include "comm/algo_choice.h"

#include <vector>

#include "ringcomm/types.h"

namespace ringcomm {
namespace {

// The CPU schedule families (RINGCOMM_ALGO's names).
bool parse_name(const std::string& s, Algo* out) {
  return parse_algo_name(s, out) && *out != Algo::kNccl && *out != Algo::kTwoShot;
}

}  // namespace

bool parse_algo_name(const std::string& s, Algo* out) {
  static const std::pair<const char*, Algo> names[] = {
      {"auto", Algo::kAuto}, {"ring", Algo::kRing}, {"oneshot", Algo::kOneShot}, {"pull", Algo::kPull},
      {"recursive_doubling", Algo::kRecursiveDoubling}, {"tree", Algo::kTree},
      {"rabenseifner", Algo::kRabenseifner}, {"bruck", Algo::kBruck},
      {"hierarchical", Algo::kHierarchical}, {"direct", Algo::kDirect},
      {"nccl", Algo::kNccl}, {"twoshot", Algo::kTwoShot}};
  for (const auto& n : names) {
    if (s == n.first) {
      *out = n.second;
      return true;
    }
  }
  return false;
}

Algo default_algo(OpKind k) {
  return algo_has(k, Algo::kRing) ? Algo::kRing : Algo::kDirect;
}

bool algo_has(OpKind k, Algo a) {
  switch (a) {
    case Algo::kAuto:
    case Algo::kPull:
      return k != OpKind::kBarrier;
    case Algo::kRing:
      return k == OpKind::kAllReduce || k == OpKind::kReduceScatter || k == OpKind::kAllGather ||
             k == OpKind::kBroadcast || k == OpKind::kReduce;
    case Algo::kOneShot:
    case Algo::kRecursiveDoubling:
    case Algo::kRabenseifner:
      return k == OpKind::kAllReduce;
    case Algo::kHierarchical:
      return k == OpKind::kAllReduce || k == OpKind::kBroadcast || k == OpKind::kReduce ||
             k == OpKind::kAllGather || k == OpKind::kReduceScatter;
    case Algo::kDirect:
      return k == OpKind::kScatter || k == OpKind::kGather || k == OpKind::kAllToAll || k == OpKind::kBarrier ||
             k == OpKind::kAllGather;
    case Algo::kTree:
      return k == OpKind::kBroadcast || k == OpKind::kReduce;
    case Algo::kBruck:
      return k == OpKind::kAllGather;
    case Algo::kNccl:
    case Algo::kTwoShot:
      return false;  // GPU only: no CPU schedule (comm/chooser.h)
  }
  return false;
}

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t i = s.find(sep, start);
    out.push_back(s.substr(start, i == std::string::npos ? std::string::npos : i - start));
    if (i == std::string::npos) return out;
    start = i + 1;
  }
}

}  // namespace

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kAuto: return "auto";
    case Algo::kRing: return "ring";
    case Algo::kOneShot: return "oneshot";
    case Algo::kPull: return "pull";
    case Algo::kRecursiveDoubling: return "recursive_doubling";
    case Algo::kTree: return "tree";
    case Algo::kRabenseifner: return "rabenseifner";
    case Algo::kBruck: return "bruck";
    case Algo::kHierarchical: return "hierarchical";
    case Algo::kDirect: return "direct";
    case Algo::kNccl: return "nccl";
    case Algo::kTwoShot: return "twoshot";
  }
  return "?";
}

AlgoChoice parse_algo_choice(const std::string& text) {
  AlgoChoice c;
  if (text.find(':') == std::string::npos) {
    Algo a;
    Algo gpu;
    if (parse_algo_name(text, &gpu) && !parse_name(text, &a)) {
      throw ValueError("algo: '" + text + "' runs on GPU buffers only (RINGCOMM_GPU_ALGO, RINGCOMM_IPC_ALGO)");
    }
    if (!parse_name(text, &a)) throw ValueError("algo: unknown algorithm '" + text + "'");
    for (int k = 1; k < kNumOpKinds; ++k) {
      if (k != static_cast<int>(OpKind::kSend) && algo_has(static_cast<OpKind>(k), a)) c.by_op[k] = a;
    }
    c.forces_pull_everywhere = a == Algo::kPull;
    return c;
  }
  for (const std::string& item : split(text, ',')) {
    std::vector<std::string> kv = split(item, ':');
    OpKind k;
    Algo a;
    if (kv.size() != 2 || !collective_from_name(kv[0], &k)) {
      throw ValueError("algo: '" + item + "' is not <op>:<algorithm> with op one of all_reduce, reduce_scatter, "
                       "all_gather, broadcast, reduce, scatter, gather, all_to_all, barrier");
    }
    if (!parse_name(kv[1], &a)) throw ValueError("algo: unknown algorithm '" + kv[1] + "' for " + kv[0]);
    if (!algo_has(k, a)) throw ValueError("algo: " + kv[0] + " has no " + kv[1] + " schedule");
    c.by_op[static_cast<int>(k)] = a;
  }
  return c;
}

}  // namespace ringcomm
