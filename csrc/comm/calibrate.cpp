// Measuring the cost model's parameters when a communicator is made
// (Communicator::measure_links), over the communicator's own sendrecv, so
// that alpha includes what a schedule step really pays (headers, the
// executor's wake-ups, the TCP I/O thread) -- and under the load a
// schedule step puts on the machine: every rank measures at once, as every
// rank of a collective communicates at once (on hosts with fewer cores than
// ranks, or one network link for several ranks, a pair measured alone
// looks twice as fast as a collective's steps are).
//
// python/ringcomm/cost_model.py agree() pairs the ranks twice: inside each
// host (local indices 2i, 2i+1), then across pairs of hosts (equal local
// index on hosts 2j, 2j+1). Both partners of a pair, all pairs at once,
// after a warm-up of 8 exchanges (which also sets up the link):
//   exchange 8 bytes, 5 rounds of 8: alpha = the best round / 8;
//   k = min(16, slots - 1) messages of 8 bytes one way, then k back,
//     against one each way: overhead = (t_k - t_1) / 2(k - 1) (median of 3);
//   exchange 1 MiB, best of 3: beta = (t - alpha) / 1 MiB.
// Rank 0 also times its reduction kernel (float32 sum, 4 MiB, best of 3):
// gamma. A sample of the measuring ranks publish their figures through the
// store and every rank reads the same records (agree(): the median of each
// figure): all pick alike, and no collective call is spent on it. On the
// slowest link here (1 Gbit/s shaped veth) this takes ~30 ms.
//
// Its send/recv are numbered like any p2p call of the pair, and the pair's
// numbering goes on from there (it must: a pull send completes when the
// peer's count of messages read reaches its number, and that count never
// goes back). Collective call numbers are untouched (no collective runs).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

#include "comm/communicator.h"
#include "ringcomm/reducer.h"

namespace ringcomm {
namespace {

using Seconds = std::chrono::duration<double>;

double now() { return Seconds(Clock::now().time_since_epoch()).count(); }

Buffer bytes_of(std::vector<char>& v) {
  Buffer b;
  b.ptr = v.data();
  b.count = v.size();
  b.dtype = DataType::kUInt8;
  b.present = true;
  return b;
}

constexpr size_t kBandwidthBytes = 1 << 20;

}  // namespace

std::vector<double> Communicator::measure_links(int intra_peer, int inter_peer, int gamma_rank) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v(7, nan);
  std::vector<char> tiny(8), tiny_in(8), big(kBandwidthBytes), big_in(kBandwidthBytes);
  // Alpha, beta, overhead of the link to `peer`, both of us measuring at once.
  auto measure_pair = [&](int peer, double* out) {
    if (peer < 0 || peer == rank_) return;
    Buffer t = bytes_of(tiny), ti = bytes_of(tiny_in), g = bytes_of(big), gi = bytes_of(big_in);
    for (int i = 0; i < 8; ++i) sendrecv(t, peer, ti, peer);  // warm-up (and, over TCP, the connection)
    auto median_of = [](std::vector<double> xs) {
      std::sort(xs.begin(), xs.end());
      return xs[xs.size() / 2];
    };
    // The best round: under load the spread is wide, and a slow round is
    // the load of something else (the warm-up above gets the pair going).
    std::vector<double> rounds;
    for (int round = 0; round < 5; ++round) {
      const double t0 = now();
      for (int i = 0; i < 8; ++i) sendrecv(t, peer, ti, peer);
      rounds.push_back((now() - t0) / 8);
    }
    const double alpha = *std::min_element(rounds.begin(), rounds.end());
    // A burst of k messages one way, then k back, against one each way: what
    // each further message costs. The lower rank sends first, the other
    // receives first (a send may wait for its receiver: pulls, full FIFOs).
    const int k = std::max(2, std::min(16, config_.nslots - 1));
    const bool first = rank_ < peer;
    auto burst = [&](int m) {
      const double t0 = now();
      for (int pass = 0; pass < 2; ++pass) {
        if ((pass == 0) == first) {
          for (int i = 0; i < m; ++i) send(t, peer, 0, false);
        } else {
          for (int i = 0; i < m; ++i) recv(ti, peer, 0, false);
        }
      }
      return now() - t0;
    };
    rounds.clear();
    for (int round = 0; round < 3; ++round) {
      rounds.push_back(std::max(0.0, (burst(k) - burst(1)) / (2.0 * (k - 1))));
    }
    const double overhead = median_of(rounds);
    double beta = 1e9;
    for (int round = 0; round < 3; ++round) {
      const double t0 = now();
      sendrecv(g, peer, gi, peer);
      beta = std::min(beta, std::max(1e-12, (now() - t0 - alpha) / kBandwidthBytes));
    }
    out[0] = alpha;
    out[1] = beta;
    out[2] = overhead;
  };
  measure_pair(intra_peer, v.data());
  measure_pair(inter_peer, v.data() + 3);
  if (rank_ == gamma_rank) {
    std::vector<float> a(1 << 20, 1.0f), b(1 << 20, 2.0f);  // 4 MiB: out of cache, as buffers are
    const Reducer red = make_reducer(DataType::kFloat32, ReduceOp::kSum);
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
      const double t0 = now();
      red.fn(a.data(), a.data(), b.data(), a.size());
      best = std::min(best, now() - t0);
    }
    v[6] = best / (a.size() * sizeof(float));
  }
  return v;
}

}  // namespace ringcomm
