// The communicator's life: construction, the thread-inside bookkeeping, the
// error state (fail, abort, error, check_usable) and close(). The class and
// how its parts divide among the communicator_*.cpp files: comm/communicator.h.
#include "comm/communicator.h"

#include <algorithm>
#include <thread>

namespace ringcomm {

Work::ErrorKind error_kind_of(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return Work::ErrorKind::kTimeout;
  if (dynamic_cast<const MismatchError*>(&e)) return Work::ErrorKind::kMismatch;
  if (dynamic_cast<const Interrupted*>(&e)) return Work::ErrorKind::kInterrupted;
  if (dynamic_cast<const RevokedError*>(&e)) return Work::ErrorKind::kRevoked;
  return Work::ErrorKind::kError;
}

Communicator::Communicator(int rank, int world, Config config)
    : rank_(rank),
      world_(world),
      config_(std::move(config)),
      algos_(parse_algo_choice(config_.algo)),
      shm_(std::make_unique<ShmTransport>(rank, world, config_.slot_bytes, config_.nslots,
                                         parse_slot_stores(config_.slot_stores))),
      router_(rank, world, shm_.get()),
      executor_(&router_, rank, world, config_.wait),
      plan_cache_(config_.plan_cache_entries),
      timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config_.timeout_s))),
      addrs_(world),
      ring_order_(world),
      model_(Topology{}, default_cost_params(), ModelLimits{}),
      send_seq_(world),
      recv_seq_(world),
      matcher_(rank, world, &router_, config_.p2p_unexpected_bytes) {
  p2p_group_.reserve(64);
  executor_.set_p2p_absorb([this](int peer) { return matcher_.absorb(peer); });
  for (int i = 0; i < world_; ++i) ring_order_[i] = i;
  tuner_.enable(config_.autotune && world_ > 1);
  set_topology(std::vector<int>(world_, 0));
}

namespace {
// The communicators (by their inside-counter) the calling thread is in a call of.
thread_local std::vector<const std::atomic<int>*> t_inside;
}  // namespace

Communicator::Inside::Inside(std::atomic<int>& n) : n_(n), mine_(&t_inside) {
  sole = n_.fetch_add(1, std::memory_order_acq_rel) == 0;
  mine_->push_back(&n_);
}

Communicator::Inside::~Inside() {
  mine_->pop_back();
  n_.fetch_sub(1, std::memory_order_acq_rel);
}

bool Communicator::thread_inside(const std::atomic<int>* counter) {
  return std::find(t_inside.begin(), t_inside.end(), counter) != t_inside.end();
}

Communicator::~Communicator() {
  try {
    close();
  } catch (...) {
  }
}

std::string Communicator::error() {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

void Communicator::check_usable() {
  if (closed_ || closing_) throw Error("ringcomm: the communicator is closed");
  if (!error_.empty()) {
    if (mentions_revoke(error_)) {
      throw RevokedError("ringcomm: the communicator is revoked (" + error_ +
                         "): agree() and shrink() still work on it; create a new one (shrink) for further calls");
    }
    throw Error("ringcomm: the communicator is unusable after an earlier error (" + error_ +
                "); create a new one");
  }
}

Clock::time_point Communicator::deadline_from_now() const { return Clock::now() + timeout_; }

// Poisons the communicator and tells the peers, so they fail fast too.
void Communicator::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.empty()) error_ = message;
  }
  std::lock_guard<std::mutex> life(life_mu_);
  if (!released_) router_.announce_abort("rank " + std::to_string(rank_) + ": " + message);
}

void Communicator::close() {
  if (thread_inside(&inside_)) {
    // close() from inside one of this communicator's calls on this thread (a
    // Python signal handler run while the call waited): releasing now would
    // pull the transport from under that call. Abort it instead; the caller
    // closes (or the last reference releases it) once the call has returned.
    abort("close() was called from inside a call of this communicator (a signal handler?)");
    throw Error("ringcomm: close() called from inside a call of this communicator on the same thread (a signal "
                "handler?): the communicator is aborted instead, and released once that call has returned");
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (closing_) {  // another thread closes it: wait until it is done
    closed_cv_.wait(lk, [&] { return closed_.load(); });
    return;
  }
  closing_ = true;
  // A thread running a call or waiting for one would otherwise wait for
  // its peers for up to the timeout while this one frees what it uses:
  // abort, so that it raises now.
  const bool busy = inside_.load() > 0 || waiters_->load() > 0;
  bool announce = false;
  if (busy && error_.empty()) {
    error_ = "the communicator was closed by another thread while " + (running_ ? running_text() : std::string("a call")) +
             " was in flight";
    announce = true;
  }
  const bool clean = error_.empty();
  stop_ = true;
  cv_.notify_all();
  lk.unlock();
  if (announce) {
    std::lock_guard<std::mutex> life(life_mu_);
    router_.announce_abort("rank " + std::to_string(rank_) + ": " + error_);
  }
  router_.wake();
  // The worker completes what is queued (or fails it fast once aborted).
  // A Python caller's Ctrl-C meanwhile aborts what is left.
  bool interrupted = false;
  std::string interrupt_text;
  if (worker_.joinable()) {
    Clock::time_point last{};
    std::unique_lock<std::mutex> l(mu_);
    while (!worker_done_) {
      closed_cv_.wait_for(l, kInterruptPoll);
      if (worker_done_ || interrupted || !interrupt_check()) continue;
      l.unlock();
      try {
        check_interrupted(Clock::now(), &last, [&] { return "close() on rank " + std::to_string(rank_); });
      } catch (const Interrupted& e) {
        interrupted = true;
        interrupt_text = e.what();
        abort(interrupt_text);
      }
      l.lock();
    }
    l.unlock();
    worker_.join();
  }
  // Calls that raced with close() see `closing_` and leave; aborted ones
  // leave within milliseconds.
  while (inside_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    std::lock_guard<std::mutex> life(life_mu_);
    // Peers still waiting for this rank fail at once instead of at their deadline.
    if (clean) router_.announce_departure();
    released_ = true;
    // TCP first: it sends what is still queued, and its I/O thread rings the
    // shm doorbell.
    if (tcp_) tcp_->close(deadline_from_now());
    tcp_.reset();
    shm_.reset();
  }
  lk.lock();
  closed_ = true;
  closed_cv_.notify_all();
  lk.unlock();
  if (interrupted) throw Interrupted(interrupt_text);
}

void Communicator::revoke(const std::string& why) {
  const std::string text = "rank " + std::to_string(rank_) + " " + kRevokedMark + (why.empty() ? "" : ": " + why);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.empty() || !mentions_revoke(error_)) error_ = text;
  }
  std::lock_guard<std::mutex> life(life_mu_);
  // A rank that had already announced an abort cannot announce again (one
  // reason per segment / TCP stream): its peers fail from that abort, which
  // is just as final.
  if (!released_) router_.announce_abort(text);
  router_.wake();
}

std::string Communicator::peer_gone(int peer) {
  if (peer < 0 || peer >= world_ || peer == rank_) return {};
  std::lock_guard<std::mutex> life(life_mu_);
  if (released_) return {};
  return router_.peer_gone(peer);
}

void Communicator::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.empty()) error_ = "aborted: " + why;
  }
  std::lock_guard<std::mutex> life(life_mu_);
  if (!released_) router_.announce_abort("rank " + std::to_string(rank_) + " aborted: " + why);
}

}  // namespace ringcomm
