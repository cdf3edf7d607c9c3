// Issue order: numbering calls, the one-thread-at-a-time rule, the call
// records peers read, the queue and its worker, the inline path of
// synchronous calls, and waiters that run the queue themselves (help).
#include "comm/communicator.h"

#include <cstring>

namespace ringcomm {

// Sequence numbers follow issue order: collectives count on the
// communicator, point-to-point messages on their pair of ranks. Holds mu_.
// The call's record says kIssued once it is queued (enqueue).
void Communicator::assign_seq(Call& call) {
  check_thread(call);
  call.issuer = issuer_;
  if (call.kind == OpKind::kSend) {
    call.tag.seq = call.root == kAnySource ? ++any_recv_seq_ : ++(call.is_send ? send_seq_ : recv_seq_)[call.root];
  } else {
    call.tag.seq = ++seq_;
  }
  if (call.reduces) call.tag.redop = static_cast<uint8_t>(call.redop);
}

// Calls on one communicator must come from one thread at a time: the ranks
// pair calls by their order, and two threads' calls interleave differently
// on each rank, which pairs different calls silently (same shapes) or hangs.
// A call issued while a call of another thread is still in flight therefore
// aborts the communicator, so that every rank raises rather than some ranks
// computing with cross-matched data. Threads may take turns. Holds mu_.
void Communicator::check_thread(const Call& call) {
  const std::thread::id me = std::this_thread::get_id();
  const bool busy = running_ || !queue_.empty();
  if (busy && issuer_ != me && issuer_ != std::thread::id()) {
    const char* name = call.name();
    const std::string other = running_ ? running_text() : std::string(queue_.front().first.name());
    const std::string msg = "ringcomm: " + std::string(name) + " was called on rank " + std::to_string(rank_) +
                            " from a second thread while " + other +
                            ", issued by another thread, was still in flight: calls on one communicator must come "
                            "from one thread at a time (all ranks pair calls by issue order); the communicator is "
                            "aborted (use one communicator per thread: comm.split)";
    if (error_.empty()) error_ = msg;
    {
      std::lock_guard<std::mutex> life(life_mu_);
      if (!released_) router_.announce_abort("rank " + std::to_string(rank_) + ": " + msg);
    }
    throw Error(msg);
  }
  issuer_ = me;
}

CallInfo Communicator::info_of(const Call& c) const {
  CallInfo info{c.op, c.tag.seq, rank_, config_.timeout_s};
  info.kind = static_cast<int>(c.kind);
  info.p2p_peer = c.kind == OpKind::kSend ? c.root : -1;
  if (c.kind == OpKind::kSend) {
    info.p2p = c.is_send ? 1 : 2;
    info.p2p_tag = c.p2p_tag;
    if (c.root == kAnySource) info.kind = -1;  // no one peer to ask
  }
  return info;
}

std::string Communicator::running_text() const {
  std::string s = running_name_;
  if (running_seq_) s += " (seq " + std::to_string(running_seq_) + ")";
  return s;
}

std::vector<std::string> Communicator::in_flight() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::string> out;
  if (running_) out.push_back(running_text());
  for (const Item& it : queue_) out.push_back(std::string(it.first.name()) + " (seq " + std::to_string(it.first.tag.seq) + ")");
  return out;
}

// The hand-off rule. A small async call is left to the thread that waits
// for it for a moment (kHandOff) before the worker may take it: waking the
// worker and then the waiter costs two thread wake-ups (tens of
// microseconds on a VM, and on a machine with as many busy threads as cores,
// a preempted peer), far more than the call. The call is not held back: the
// waiter runs it at wait() (as MPI progresses at MPI_Wait), or the worker
// takes it once due, without being woken, since after a small async call it
// sleeps in kHandOff slices for kLinger. Large calls, which are the ones
// overlapped with compute, go to the worker at once.
namespace {
constexpr size_t kHandOffBytes = 64 << 10;
constexpr auto kHandOff = std::chrono::microseconds(200);
constexpr auto kLinger = std::chrono::milliseconds(20);
}  // namespace

// Queues a call for the worker (or a thread that helps). Holds mu_ via lk,
// which it releases. `async`: the caller returns a Work (the worker is to
// progress the call); otherwise the caller is about to wait on the call
// itself, and leaves the worker asleep (its wait runs the call, and a busy
// worker takes queued calls without being woken).
std::shared_ptr<Work> Communicator::enqueue(Call call, std::unique_lock<std::mutex>& lk, bool async) {
  record(call, CallState::kIssued);  // (a call run inline goes straight to kRunning)
  auto work = std::make_shared<Work>(call.name(), waiters_);
  work->set_helper([this, w = work.get()](bool may_run) { help(w, may_run); });
  work->set_on_interrupt([this](const std::string& why) { abort(why); });
  call.memo_owner = false;  // run by whichever thread takes the queue
  const size_t bytes = call.kind == OpKind::kSend ? call.a.nbytes() : call.model_bytes;
  const bool hand_off = async && bytes <= kHandOffBytes;
  if (hand_off) {
    const auto now = Clock::now();
    call.due = now + kHandOff;
    linger_until_ = now + kLinger;
  }
  queue_.emplace_back(std::move(call), work);
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  if (async && !(hand_off && worker_ticking_)) cv_.notify_all();
  lk.unlock();
  router_.wake();  // a worker asleep in a send/recv group picks the new call up
  return work;
}

void Communicator::release_inline() {
  std::lock_guard<std::mutex> lk(mu_);
  running_ = false;
  // The worker only waits for queued calls: waking it for nothing costs a
  // context switch on the core this thread runs on.
  if (worker_.joinable() && !queue_.empty()) cv_.notify_all();
}

std::shared_ptr<Work> Communicator::submit(Call&& call, bool async, int* source) {
  std::unique_lock<std::mutex> lk(mu_);
  check_usable();
  assign_seq(call);
  if (!async && queue_.empty() && !running_) {
    // The latency path: run in this thread, no allocation, no hand-off.
    running_ = true;
    running_seq_ = 0;
    if (call.kind != OpKind::kSend) {
      running_name_ = call.name();  // `call` stays here while it runs
    } else {
      running_name_ = call.op;  // "send" / "recv" (a literal: the group moves the call)
    }
    lk.unlock();
    if (call.kind != OpKind::kSend) {
      // A collective: its error is thrown as it is (no Work to carry it).
      try {
        run_inline(call);
      } catch (...) {
        release_inline();
        throw;
      }
      release_inline();
      return nullptr;
    }
    Work work(call.op);  // never waited on: its name is only the op's
    P2pMember m;
    m.call = std::move(call);
    m.work = &work;
    execute_p2p(&m, 1, false);
    release_inline();
    work.rethrow();
    if (source) *source = work.source();
    return nullptr;
  }
  auto work = enqueue(std::move(call), lk, async);
  if (async) return work;
  work->wait(-1);
  if (source) *source = work->source();
  return nullptr;
}

// Runs the oldest queued call; `lk` holds mu_ and the queue is not empty.
void Communicator::run_front(std::unique_lock<std::mutex>& lk, bool take_queued) {
  auto item = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  // Named without building a string per call (in_flight() adds the seq).
  if (item.first.kind == OpKind::kSend) {
    std::strncpy(running_p2p_name_, item.first.name(), sizeof(running_p2p_name_) - 1);
    running_name_ = running_p2p_name_;
  } else {
    running_name_ = item.first.op;
  }
  running_seq_ = item.first.tag.seq;
  const bool collective = item.first.kind != OpKind::kSend;
  const std::string failed_earlier = collective ? error_ : std::string();  // (empty: no allocation)
  lk.unlock();
  if (!collective) {
    P2pMember m;
    m.call = std::move(item.first);
    m.work = item.second.get();
    m.keep = std::move(item.second);
    execute_p2p(&m, 1, take_queued);
  } else {
    execute(item.first, *item.second, failed_earlier);
  }
  lk.lock();
  running_ = false;
  if (!queue_.empty()) cv_.notify_all();  // the worker waits for queued calls only
}

void Communicator::worker_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    // No polling when idle: a caller that waits soon runs the call itself
    // (help), and the worker's wake-up (tens of microseconds) only matters
    // for calls left to progress in the background. After a small async
    // call it sleeps in kHandOff slices for a while (the hand-off rule).
    const auto now = Clock::now();
    if (queue_.empty()) {
      if (stop_) {
        worker_done_ = true;
        closed_cv_.notify_all();
        return;
      }
    } else if (!running_) {
      const Clock::time_point due = queue_.front().first.due;
      if (stop_ || due <= now) {
        run_front(lk);
        continue;
      }
      worker_ticking_ = true;
      cv_.wait_until(lk, due);
      worker_ticking_ = false;
      continue;
    }
    if (now < linger_until_) {
      worker_ticking_ = true;
      cv_.wait_until(lk, std::min(now + kHandOff, linger_until_));
      worker_ticking_ = false;
    } else {
      cv_.wait(lk);
    }
  }
}

// A thread waiting for `work` runs the queue itself while nobody else does:
// handing a call to the worker and back costs two thread wake-ups (tens of
// microseconds on a VM), more than a small call takes. Order is kept: calls
// still run one at a time, oldest first.
//
// A send/recv group only when it is this thread's one call, run alone (as a
// blocking send/recv is): a group runs until every member is done, and an
// isend in it may wait for a recv that only this thread is yet to issue
// (isend, isend, then a blocking recv, on both ranks, with more bytes than
// the FIFO holds: each thread would run its group forever, waiting for the
// other's next recv). Other groups are the worker's, due at once; this
// thread's call joins the group and returns when it is done.
void Communicator::help(const Work* work, bool may_run) {
  Inside inside(inside_);
  std::unique_lock<std::mutex> lk(mu_);
  if (closing_) return;  // the worker drains (or fails) what is queued
  while (may_run && !work->is_completed() && !running_ && !queue_.empty()) {
    if (queue_.front().first.kind == OpKind::kSend) {
      if (queue_.size() != 1 || queue_.front().second.get() != work) break;
      run_front(lk, false);
      continue;
    }
    run_front(lk);
  }
  if (work->is_completed() || queue_.empty()) return;
  // Left to the worker (a group, a timed wait, or behind a call another
  // thread runs): someone waits, so nothing queued waits out its hand-off
  // any longer. A running call wakes the worker as it ends.
  for (Item& it : queue_) it.first.due = Clock::time_point{};
  if (!running_) cv_.notify_all();
}

}  // namespace ringcomm
