#include "testing/device_sim.h"

#include <cstring>
#include <string>

#include "ringcomm/reducer.h"

namespace ringcomm {

SimFabric::SimFabric(int world, double timeout_s)
    : world_(world), timeout_(timeout_s), sends_(world * world), recvs_(world * world) {}

// Moves data for every pair whose oldest send and oldest receive are both posted.
void SimFabric::match_locked() {
  for (int i = 0; i < world_ * world_; ++i) {
    while (!sends_[i].empty() && !recvs_[i].empty()) {
      Posted s = sends_[i].front(), r = recvs_[i].front();
      if (s.nbytes != r.nbytes && error_.empty()) {
        error_ = "rank " + std::to_string(i / world_) + " sent " + std::to_string(s.nbytes) + " bytes to rank " +
                 std::to_string(i % world_) + ", which receives " + std::to_string(r.nbytes);
      }
      if (s.nbytes) std::memcpy(r.ptr, s.ptr, std::min(s.nbytes, r.nbytes));
      *s.done = *r.done = true;
      sends_[i].pop_front();
      recvs_[i].pop_front();
    }
  }
}

void SimFabric::group(int rank, const std::vector<P2pOp>& ops) {
  std::unique_ptr<bool[]> done(new bool[ops.size()]());
  std::unique_lock<std::mutex> lk(mu_);
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2pOp& p = ops[i];
    if (p.peer < 0 || p.peer >= world_ || p.peer == rank) throw Error("ringcomm sim: bad peer");
    (p.send ? sends_[rank * world_ + p.peer] : recvs_[p.peer * world_ + rank]).push_back({p.ptr, p.nbytes, &done[i]});
  }
  match_locked();
  cv_.notify_all();
  auto all_done = [&] {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!done[i]) return false;
    }
    return true;
  };
  if (!cv_.wait_for(lk, timeout_, [&] { return all_done() || !error_.empty(); })) {
    error_ = "rank " + std::to_string(rank) + "'s group waited for its peers past the timeout (deadlock)";
    cv_.notify_all();
    throw TimeoutError("ringcomm sim: " + error_);
  }
  if (!error_.empty()) throw Error("ringcomm sim: " + error_);
}

void SimOps::reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) {
  make_reducer(dtype, op).fn(dst, a, b, count);
}

void SimOps::divide(DataType dtype, char* buf, size_t count, int divisor) {
  make_reducer(dtype, ReduceOp::kAvg).divide(buf, count, divisor);
}

void SimOps::copy(char* dst, const char* src, size_t nbytes) { std::memmove(dst, src, nbytes); }

char* SimOps::alloc_scratch(size_t nbytes) { return new char[nbytes]; }

void SimOps::free_scratch(char* p) { delete[] p; }

}  // namespace ringcomm
