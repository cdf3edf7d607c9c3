// Measuring the cost model's parameters when a communicator is made
// (Communicator::calibrate), over the communicator's own send/recv, so that
// alpha includes what a schedule step really pays (headers, the executor's
// wake-ups, the TCP I/O thread).
//
// Two pairs measure, everybody else only waits for the result:
//   intra: the two lowest ranks of the first host with two ranks or more;
//   inter: rank 0 and the lowest rank of the first other host.
// Each pair runs, after a warm-up (which also sets up the link):
//   ping-pong of 8 bytes, 3 rounds of 8 round trips: alpha = best round / 16;
//   8 back-to-back 8-byte sends, one reply: overhead = (t - 2 alpha) / 7;
//   1 MiB one way, 8 bytes back, best of 3: beta = (t - 2 alpha) / 1 MiB.
// Rank 0 also times its reduction kernel (float32 sum, 4 MiB, best of 3):
// gamma. The intra pair sends its figures to rank 0, which broadcasts all
// of them: every rank ends with the same parameters, so all pick alike.
// On the slowest link here (1 Gbit/s shaped veth) this takes ~30 ms.
#include <algorithm>
#include <chrono>
#include <cstring>
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

CostParams Communicator::calibrate(bool measure, const std::vector<double>& given) {
  CostParams p = default_cost_params();
  if (world_ == 1) {
    set_cost_params(p);
    return p;
  }
  // Call numbers seen by users (errors, diagnostics, the torch backend) start
  // after the calibration: it is numbered like any call (its messages must
  // match), then the numbering restarts on every rank at the same point.
  // [intra alpha, beta, overhead, inter alpha, beta, overhead, gamma, how]
  // how: 0 defaults, 1 measured, 2 given (rank 0's file)
  std::vector<double> v = {p.intra.alpha, p.intra.beta, p.intra.overhead, p.inter.alpha,
                           p.inter.beta,  p.inter.overhead, p.gamma,    0};
  if (rank_ == 0 && given.size() == 7) {
    std::copy(given.begin(), given.end(), v.begin());
    v[7] = 2;
  }
  int intra_a = -1, intra_b = -1, inter_b = -1;
  for (const auto& m : topo_.members) {
    if (m.size() >= 2) {
      intra_a = m[0];
      intra_b = m[1];
      break;
    }
  }
  if (topo_.hosts > 1) inter_b = topo_.members[1][0];
  std::vector<char> tiny(8), big(kBandwidthBytes);
  // One pair's figures: alpha, beta, overhead (measured by `a`, peer `b` echoes).
  auto measure_pair = [&](int a, int b, double* out) {
    if (rank_ != a && rank_ != b) return;
    const bool me = rank_ == a;
    const int peer = me ? b : a;
    Buffer t = bytes_of(tiny), g = bytes_of(big);
    auto ping = [&] {
      if (me) {
        send(t, peer, false);
        recv(t, peer, false);
      } else {
        recv(t, peer, false);
        send(t, peer, false);
      }
    };
    for (int i = 0; i < 2; ++i) ping();  // warm-up
    double alpha = 1e9;
    for (int round = 0; round < 3; ++round) {
      const double t0 = now();
      for (int i = 0; i < 8; ++i) ping();
      alpha = std::min(alpha, (now() - t0) / 16);
    }
    double overhead = 1e9;
    for (int round = 0; round < 2; ++round) {
      const double t0 = now();
      if (me) {
        for (int i = 0; i < 8; ++i) send(t, peer, false);
        recv(t, peer, false);
      } else {
        for (int i = 0; i < 8; ++i) recv(t, peer, false);
        send(t, peer, false);
      }
      overhead = std::min(overhead, std::max(0.0, (now() - t0 - 2 * alpha) / 7));
    }
    double beta = 1e9;
    for (int round = 0; round < 3; ++round) {
      const double t0 = now();
      if (me) {
        send(g, peer, false);
        recv(t, peer, false);
      } else {
        recv(g, peer, false);
        send(t, peer, false);
      }
      beta = std::min(beta, std::max(1e-12, (now() - t0 - 2 * alpha) / kBandwidthBytes));
    }
    if (me) {
      out[0] = alpha;
      out[1] = beta;
      out[2] = overhead;
    }
  };
  if (measure && v[7] == 0) {
    if (intra_a >= 0) measure_pair(intra_a, intra_b, v.data());
    if (inter_b >= 0) measure_pair(0, inter_b, v.data() + 3);
    if (intra_a > 0) {  // the intra pair's figures go to rank 0
      std::vector<char> fig(3 * sizeof(double));
      if (rank_ == intra_a) {
        std::memcpy(fig.data(), v.data(), fig.size());
        send(bytes_of(fig), 0, false);
      } else if (rank_ == 0) {
        recv(bytes_of(fig), intra_a, false);
        std::memcpy(v.data(), fig.data(), fig.size());
      }
    }
    if (rank_ == 0) {
      std::vector<float> a(1 << 20, 1.0f), b(1 << 20, 2.0f);  // 4 MiB: out of cache, as buffers are
      const Reducer red = make_reducer(DataType::kFloat32, ReduceOp::kSum);
      double best = 1e9;
      for (int i = 0; i < 3; ++i) {
        const double t0 = now();
        red.fn(a.data(), a.data(), b.data(), a.size());
        best = std::min(best, now() - t0);
      }
      v[6] = best / (a.size() * sizeof(float));
      v[7] = 1;
    }
  }
  Buffer all;
  all.ptr = reinterpret_cast<char*>(v.data());
  all.count = v.size();
  all.dtype = DataType::kFloat64;
  all.present = true;
  broadcast(all, 0, false);
  p.intra = {v[0], v[1], v[2]};
  p.inter = {v[3], v[4], v[5]};
  p.gamma = v[6];
  restart_numbering();
  p.source = v[7] == 1 ? "measured" : v[7] == 2 ? "file (rank 0's RINGCOMM_COST_MODEL)" : "default";
  set_cost_params(p);
  return p;
}

}  // namespace ringcomm
