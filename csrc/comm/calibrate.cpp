// Measuring the cost model's parameters when a communicator is made
// (Communicator::measure_links), over the communicator's own send/recv, so that
// alpha includes what a schedule step really pays (headers, the executor's
// wake-ups, the TCP I/O thread).
//
// Two pairs measure (python/ringcomm/cost_model.py agree() picks them: ring
// neighbours, so no connection is opened for it), everybody else returns at
// once:
//   intra: the two lowest ranks of the first host with two ranks or more;
//   inter: the last rank of the first host and the first of the second.
// Each pair runs, after a warm-up (which also sets up the link):
//   ping-pong of 8 bytes, 3 rounds of 8 round trips: alpha = best round / 16;
//   8 back-to-back 8-byte sends, one reply: overhead = (t - 2 alpha) / 7;
//   1 MiB one way, 8 bytes back, best of 3: beta = (t - 2 alpha) / 1 MiB.
// One rank also times its reduction kernel (float32 sum, 4 MiB, best of 3):
// gamma. The measuring ranks publish their figures through the store and
// every rank reads the same records (agree()): all pick alike, and no
// collective call is spent on it. On the slowest link here (1 Gbit/s
// shaped veth) this takes ~30 ms.
//
// Call numbers seen by users (errors, diagnostics, the torch backend) start
// after the calibration: its send/recv are numbered like any (their
// messages must match), then the pair's numbering restarts.
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

std::vector<double> Communicator::measure_links(int intra_a, int intra_b, int inter_a, int inter_b, int gamma_rank) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v(7, nan);
  std::vector<char> tiny(8), big(kBandwidthBytes);
  // One pair's figures: alpha, beta, overhead (measured by `a`, peer `b` echoes).
  auto measure_pair = [&](int a, int b, double* out) {
    if (a < 0 || b < 0 || a == b || (rank_ != a && rank_ != b)) return;
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
    for (int i = 0; i < 2; ++i) ping();  // warm-up (and, over TCP, the connection)
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
  measure_pair(intra_a, intra_b, v.data());
  measure_pair(inter_a, inter_b, v.data() + 3);
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
  restart_numbering();
  return v;
}

}  // namespace ringcomm
