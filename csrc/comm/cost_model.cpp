#include "comm/cost_model.h"

#include <algorithm>
#include <cmath>

#include "comm/call_plan.h"
#include "ringcomm/types.h"

namespace ringcomm {

CostParams default_cost_params() {
  // Rough figures of the 2-core machines (docs/algorithms.md): a calibration
  // at init or a file from `ringcomm-bench --calibrate` replaces them.
  CostParams p;
  p.intra = {3e-6, 1.0 / 5e9, 0.3e-6};
  p.inter = {60e-6, 1.0 / 1.2e9, 4e-6};
  p.gamma = 1.0 / 8e9;
  p.source = "default";
  return p;
}

namespace {

// How many of `streams` concurrent cross-host transfers of one host share
// its busiest network link, the `nics` links taking them in turn.
double link_share(const CostParams& p, double streams) {
  return std::ceil(streams / std::max(1, p.nics));
}

// One step of a schedule: which link kind its slowest transfer takes, and
// how many of its cross-host transfers leave the busiest host.
struct StepShape {
  bool inter = false;
  bool any = false;
  int streams = 1;
};

// `to(r)`: the rank r sends to in this step, or -1.
template <class To>
StepShape shape_of(const Topology& t, To to, std::vector<int>& per_host) {
  StepShape s;
  std::fill(per_host.begin(), per_host.end(), 0);
  int most = 0;
  for (int r = 0; r < t.world(); ++r) {
    const int q = to(r);
    if (q < 0 || q == r) continue;
    s.any = true;
    if (t.host_of[q] != t.host_of[r]) {
      s.inter = true;
      most = std::max(most, ++per_host[t.host_of[r]]);
    }
  }
  s.streams = std::max(1, most);
  return s;
}

// Accumulates a schedule's cost, step by step.
struct Tally {
  const CostParams& p;
  Affine cost;
  // A step in which each sender moves `frac` * S bytes and the receivers
  // reduce `reduce_frac` * S bytes.
  void step(const StepShape& s, double frac, double reduce_frac = 0) {
    if (!s.any) return;
    const LinkCost& l = s.inter ? p.inter : p.intra;
    cost.a += l.alpha;
    cost.b += frac * l.beta * (s.inter ? link_share(p, s.streams) : 1) + reduce_frac * p.gamma;
  }
};

int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// Levels of a binomial tree over n ranks: ceil(log2 n).
int ceil_log2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

// The ring in the order it runs (Topology::ring): its cross-host edges per host.
StepShape ring_shape(const Topology& t, std::vector<int>& per_host) {
  const int n = t.world();
  std::vector<int> next(n);
  for (int q = 0; q < n; ++q) next[t.ring[q]] = t.ring[(q + 1) % n];
  return shape_of(t, [&](int r) { return next[r]; }, per_host);
}

// Recursive doubling / Rabenseifner's exchange structure (algo/doubling.cpp):
// the fold of the first 2*rem ranks, log2(p) exchanges, the unfold.
// `frac(mask)` is the share of S the exchange of `mask` moves.
template <class Frac>
Affine doubling_cost(const Topology& t, const CostParams& p, bool rabenseifner, std::vector<int>& per_host,
                     Frac frac) {
  const int n = t.world(), pw = floor_pow2(n), rem = n - pw;
  Tally tally{p, {}};
  auto new_rank = [&](int r) { return r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem; };
  auto rank_of = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  if (rem > 0) tally.step(shape_of(t, [&](int r) { return r < 2 * rem && r % 2 == 0 ? r + 1 : -1; }, per_host), 1, 1);
  auto exchange = [&](int mask, bool halving) {
    StepShape s = shape_of(
        t,
        [&](int r) {
          const int v = new_rank(r);
          return v < 0 ? -1 : rank_of(v ^ mask);
        },
        per_host);
    const double f = frac(mask);
    tally.step(s, f, rabenseifner ? (halving ? f : 0) : 1);
  };
  if (rabenseifner) {
    for (int m = pw / 2; m >= 1; m /= 2) exchange(m, true);
    for (int m = 1; m < pw; m *= 2) exchange(m, false);
  } else {
    for (int m = 1; m < pw; m *= 2) exchange(m, false);
  }
  if (rem > 0) tally.step(shape_of(t, [&](int r) { return r < 2 * rem && r % 2 ? r - 1 : -1; }, per_host), 1);
  return tally.cost;
}

// Messages a rank of host h sends to peers on other hosts / its own, when
// every rank sends to every other: per host, the busiest link's load.
struct AllPairs {
  double inter_msgs = 0;  // messages on the busiest host's busiest network link
  double intra_msgs = 0;  // messages one rank sends to its host's peers
  bool inter = false;
};

AllPairs all_pairs(const Topology& t, const CostParams& p) {
  AllPairs a;
  const int n = t.world();
  for (int h = 0; h < t.hosts; ++h) {
    const double l = t.local_count(h);
    a.inter_msgs = std::max(a.inter_msgs, link_share(p, l) * (n - l));
    a.intra_msgs = std::max(a.intra_msgs, l - 1);
  }
  a.inter = t.hosts > 1;
  return a;
}

}  // namespace

CostModel::CostModel(Topology topo, CostParams params, ModelLimits limits)
    : topo_(std::move(topo)), params_(std::move(params)), limits_(limits) {
  build();
}

double FamilyFit::ratio(double bytes) const {
  if (points.empty()) return 1;
  if (bytes <= points.front().first) return points.front().second;
  if (bytes >= points.back().first) return points.back().second;
  size_t i = 1;
  while (points[i].first < bytes) ++i;
  const auto& [x0, r0] = points[i - 1];
  const auto& [x1, r1] = points[i];
  const double t = std::log(bytes / x0) / std::log(x1 / x0);
  return r0 + t * (r1 - r0);
}

void CostModel::build() {
  entries_.clear();
  const int n = topo_.world();
  if (n <= 0) return;
  const double dn = n;
  const CostParams& p = params_;
  std::vector<int> per_host(topo_.hosts, 0);
  auto add = [&](OpKind k, Algo a, Affine c) {
    Entry e;
    e.kind = k;
    e.algo = a;
    e.cost = c;
    for (size_t i = 0; i < p.fits.size(); ++i) {
      if (p.fits[i].kind == k && p.fits[i].algo == a) e.fit = static_cast<int>(i);
    }
    entries_.push_back(e);
    return entries_.size() - 1;
  };
  if (n == 1) {
    // Nothing moves: one candidate per op, the call's fixed cost.
    for (OpKind k : {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather, OpKind::kBroadcast,
                     OpKind::kReduce}) {
      add(k, Algo::kRing, {});
    }
    for (OpKind k : {OpKind::kScatter, OpKind::kGather, OpKind::kAllToAll, OpKind::kBarrier}) add(k, Algo::kDirect, {});
    return;
  }
  const LinkCost& worst = topo_.hosts > 1 ? p.inter : p.intra;
  const AllPairs pairs = all_pairs(topo_, p);
  // Every rank messages every other once (one-shot, scatter, all-to-all): the
  // first message's latency plus issuing the rest.
  const double all_pairs_a = worst.alpha + (n - 2) * (pairs.inter ? p.inter.overhead : p.intra.overhead);
  auto all_pairs_b = [&](double frac) {
    return frac * std::max(pairs.inter ? p.inter.beta * pairs.inter_msgs : 0.0, p.intra.beta * pairs.intra_msgs);
  };
  // The dissemination barrier: ceil(log2 n) rounds of one message; rooted
  // calls run it first, carrying the agreement check (a few words), except
  // where their schedules have every rank hear from every other instead
  // (comm/call_plan.h plan_checks_itself): at two ranks (an empty message
  // each way, at once), and the trees' covering form beyond.
  Tally bar{p, {}};
  for (int d = 1; d < n; d *= 2) bar.step(shape_of(topo_, [&](int r) { return (r + d) % n; }, per_host), 0);
  const double agreement =
      limits_.check_agreement && !wants_mutual_pair(n, limits_.check_agreement) ? bar.cost.a : 0;

  // Ring (host-contiguous): 2(n-1) steps of S/n for all_reduce.
  const StepShape ring = ring_shape(topo_, per_host);
  auto ring_steps = [&](int steps, double reduce) {
    Tally t{p, {}};
    for (int i = 0; i < steps; ++i) t.step(ring, 1 / dn, i < n - 1 ? reduce / dn : 0);
    return t.cost;
  };
  add(OpKind::kAllReduce, Algo::kRing, ring_steps(2 * (n - 1), 1));
  add(OpKind::kReduceScatter, Algo::kRing, ring_steps(n - 1, 1));
  add(OpKind::kAllGather, Algo::kRing, ring_steps(n - 1, 0));

  // One-shot: every rank sends its whole buffer to every other and reduces n-1 inputs.
  {
    const size_t i = add(OpKind::kAllReduce, Algo::kOneShot, {all_pairs_a, all_pairs_b(1) + (dn - 1) * p.gamma});
    entries_[i].max_bytes = limits_.oneshot_max_bytes;
  }
  // Recursive doubling: log2(p) whole-buffer exchanges; Rabenseifner: halving
  // moves S/2, S/4, ..., doubling the same back (the mask is the share in p-ths).
  const double pw = floor_pow2(n);
  add(OpKind::kAllReduce, Algo::kRecursiveDoubling, doubling_cost(topo_, p, false, per_host, [](int) { return 1.0; }));
  add(OpKind::kAllReduce, Algo::kRabenseifner,
      doubling_cost(topo_, p, true, per_host, [&](int mask) { return mask / pw; }));

  // Hierarchical: intra-host ring reduce-scatter over min_local blocks, a
  // ring all-reduce of one block among the ranks of equal local index (all
  // min_local rings at once share each host's links), intra-host all-gather.
  if (topo_.hosts > 1 && topo_.max_local > 1) {
    const double lmin = topo_.min_local, lmax = topo_.max_local, h = topo_.hosts;
    Affine c;
    c.a = 2 * (lmax - 1) * p.intra.alpha + 2 * (h - 1) * p.inter.alpha;
    c.b = (lmax - 1) / lmin * (2 * p.intra.beta + p.gamma) +
          (2 * (h - 1) / h * p.inter.beta * link_share(p, lmin) + (h - 1) / h * p.gamma) / lmin;
    add(OpKind::kAllReduce, Algo::kHierarchical, c);
  }

  // Hierarchical all-gather / reduce-scatter (algo/hierarchical.cpp): per
  // round (one on even hosts, ceil(lmax / lmin) otherwise) H-1 inter-host
  // steps of S/n, lmin rings sharing each host's link, and per host g and
  // round an intra-host ring of lmax-1 steps of S/n; uneven hosts add one
  // intra-host message for the blocks past lmin.
  if (topo_.hosts > 1 && topo_.max_local > 1) {
    const double lmin = topo_.min_local, lmax = topo_.max_local, h = topo_.hosts;
    const double rounds = std::ceil(lmax / lmin);
    const double extra = lmax > lmin ? 1 : 0;
    Affine ag{rounds * ((h - 1) * p.inter.alpha + h * (lmax - 1) * p.intra.alpha) + extra * p.intra.alpha,
              (rounds * ((h - 1) * p.inter.beta * link_share(p, lmin) + h * (lmax - 1) * p.intra.beta) +
               extra * p.intra.beta) / dn};
    Affine rs{ag.a, ag.b + rounds * ((h - 1) + h * (lmax - 1)) * p.gamma / dn};
    add(OpKind::kAllGather, Algo::kHierarchical, ag);
    add(OpKind::kReduceScatter, Algo::kHierarchical, rs);
  }

  // Bruck's all-gather: step d moves min(d, n-d) blocks to rank r-d.
  {
    Tally t{p, {}};
    for (int d = 1; d < n; d *= 2) {
      t.step(shape_of(topo_, [&](int r) { return ((r - d) % n + n) % n; }, per_host), std::min(d, n - d) / dn);
    }
    add(OpKind::kAllGather, Algo::kBruck, t.cost);
  }

  // Direct all-gather: every rank sends its block to every other at once.
  add(OpKind::kAllGather, Algo::kDirect, {all_pairs_a, all_pairs_b(1 / dn)});

  // Binomial trees (rooted at 0 for the model): level m, every v multiple of
  // 2m sends the whole buffer to v + m.
  {
    const int top = 1 << ceil_log2(n);
    Tally b{p, {}}, r{p, {}};
    for (int m = top >> 1; m >= 1; m >>= 1) {
      StepShape s = shape_of(topo_, [&](int v) { return v % (2 * m) == 0 && v + m < n ? v + m : -1; }, per_host);
      b.step(s, 1);
      r.step(s, 1, 1);
    }
    if (wants_covering(n, limits_.check_agreement)) {
      // The covering form (algo/schedules.h): the tree's data in the
      // dissemination's rounds, every rank sending in each; no agreement.
      b.cost.a = std::max(b.cost.a, bar.cost.a);
      r.cost.a = std::max(r.cost.a, bar.cost.a);
    } else {
      b.cost.a += agreement;
      r.cost.a += agreement;
    }
    add(OpKind::kBroadcast, Algo::kTree, b.cost);
    add(OpKind::kReduce, Algo::kTree, r.cost);
    // Trees of trees: ceil(log2 hosts) inter-host levels, then ceil(log2
    // max_local) intra-host ones.
    if (topo_.hosts > 1 && topo_.max_local > 1) {
      const double li = ceil_log2(topo_.max_local), le = ceil_log2(topo_.hosts);
      Affine hb{li * p.intra.alpha + le * p.inter.alpha + agreement, li * p.intra.beta + le * p.inter.beta};
      Affine hr{hb.a, hb.b + (li + le) * p.gamma};
      add(OpKind::kBroadcast, Algo::kHierarchical, hb);
      add(OpKind::kReduce, Algo::kHierarchical, hr);
    }
  }
  // Chains along the ring from the root, pipelined in slots: n-1 hops of
  // latency, the message once at the slowest link's rate, and n-2 slots of
  // pipeline fill.
  for (OpKind k : {OpKind::kBroadcast, OpKind::kReduce}) {
    const bool reduces = k == OpKind::kReduce;
    const LinkCost& l = ring.inter ? p.inter : p.intra;
    const double per_byte = l.beta + (reduces ? p.gamma : 0);
    const size_t i = add(k, Algo::kRing, {(n - 1) * l.alpha + agreement, per_byte});
    entries_[i].fill_hops = n - 2;
  }
  // Direct exchanges: the root (scatter, gather) or every rank (all_to_all)
  // moves n-1 blocks of S/n; barrier: the dissemination barrier's rounds.
  {
    const double root_inter = dn - topo_.local_count(0), root_intra = topo_.local_count(0) - 1;
    Affine rooted{all_pairs_a + agreement,
                  std::max(p.inter.beta * root_inter, p.intra.beta * root_intra) / dn};
    add(OpKind::kScatter, Algo::kDirect, rooted);
    add(OpKind::kGather, Algo::kDirect, rooted);
    add(OpKind::kAllToAll, Algo::kDirect, {all_pairs_a, all_pairs_b(1 / dn)});
    add(OpKind::kBarrier, Algo::kDirect, bar.cost);
  }
}

double CostModel::eval(const Entry& e, size_t nbytes) const {
  const double s = static_cast<double>(nbytes);
  double t = e.cost.a + e.cost.b * s;
  // Chains: each hop but the last also waits for the first slot to arrive.
  t += e.fill_hops * std::min<double>(s, static_cast<double>(limits_.slot_bytes)) * e.cost.b;
  return e.fit >= 0 ? t * params_.fits[e.fit].ratio(s) : t;
}

std::vector<Prediction> CostModel::predict(OpKind kind, size_t nbytes) const {
  std::vector<Prediction> out;
  for (const Entry& e : entries_) {
    if (e.kind == kind && nbytes <= e.max_bytes) out.push_back({e.algo, eval(e, nbytes)});
  }
  // Stable: equal predictions keep the order above (the simpler family first).
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) { return a.seconds < b.seconds; });
  return out;
}

Algo CostModel::pick(OpKind kind, size_t nbytes) const {
  Algo best = Algo::kAuto;
  double t = 0;
  for (const Entry& e : entries_) {
    if (e.kind != kind || nbytes > e.max_bytes) continue;
    const double x = eval(e, nbytes);
    if (best == Algo::kAuto || x < t) {
      best = e.algo;
      t = x;
    }
  }
  return best;
}

double CostModel::seconds(OpKind kind, Algo algo, size_t nbytes) const {
  for (const Entry& e : entries_) {
    if (e.kind == kind && e.algo == algo) return eval(e, nbytes);
  }
  throw ValueError(std::string("cost model: ") + op_kind_name(kind) + " has no " + algo_name(algo) + " schedule here");
}

}  // namespace ringcomm
