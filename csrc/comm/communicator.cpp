#include "comm/communicator.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "algo/schedules.h"
#include "comm/call_check.h"
#include "comm/call_plan.h"
#include "comm/chooser.h"
#include "ringcomm/copy.h"
#include "ringcomm/reducer.h"

namespace ringcomm {
namespace {

constexpr uint8_t kNoReduce = 0xff;

}  // namespace

Work::ErrorKind error_kind_of(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return Work::ErrorKind::kTimeout;
  if (dynamic_cast<const MismatchError*>(&e)) return Work::ErrorKind::kMismatch;
  if (dynamic_cast<const Interrupted*>(&e)) return Work::ErrorKind::kInterrupted;
  return Work::ErrorKind::kError;
}

Communicator::Communicator(int rank, int world, Config config)
    : rank_(rank),
      world_(world),
      config_(std::move(config)),
      algos_(parse_algo_choice(config_.algo)),
      shm_(std::make_unique<ShmTransport>(rank, world, config_.slot_bytes, config_.nslots)),
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
  set_topology(std::vector<int>(world_, 0));
}

// Large sends pull where every rank can (the sender picks the form of each
// message, the receiver follows it: comm/p2p_match.cpp).
void Communicator::set_pull(bool on) {
  pull_ok_ = on && config_.pull;
  memo_.valid = false;  // resolve_algo's answers depend on it
  matcher_.set_pull(pull_ok_, algos_.forces_pull_everywhere ? 0 : config_.pull_min_bytes);
}

namespace {
// The communicators (by their inside-counter) the calling thread is in a call of.
thread_local std::vector<const std::atomic<int>*> t_inside;
}  // namespace

Communicator::Inside::Inside(std::atomic<int>& n) : n_(n) {
  n_.fetch_add(1, std::memory_order_acq_rel);
  t_inside.push_back(&n_);
}

Communicator::Inside::~Inside() {
  t_inside.pop_back();
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

std::string Communicator::create_segment(const std::vector<int>& members) {
  if (std::find(members.begin(), members.end(), rank_) == members.end()) {
    throw Error("ringcomm: create_segment: this rank is not among the members");
  }
  return shm_->create_inbox(members);
}

void Communicator::connect(const std::vector<std::string>& names) { shm_->connect(names); }

void Communicator::set_ring_order(const std::vector<int>& order) {
  if (static_cast<int>(order.size()) != world_) {
    throw ValueError("ring order: " + std::to_string(order.size()) + " ranks for a communicator of " +
                     std::to_string(world_));
  }
  std::vector<char> seen(world_, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    const int r = order[i];
    if (r < 0 || r >= world_ || seen[r]) throw ValueError("ring order: not a permutation of the ranks");
    seen[r] = 1;
    if (r == rank_) ring_pos_ = static_cast<int>(i);
  }
  ring_order_ = order;
  ring_identity_ = true;
  for (int i = 0; i < world_; ++i) ring_identity_ = ring_identity_ && order[i] == i;
  topo_.ring = ring_order_;
  plan_cache_.clear();  // plans of the old order (memo_ too: the cache's generation moves)
  rebuild_model(model_.params());
}

void Communicator::set_topology(const std::vector<int>& labels) {
  if (static_cast<int>(labels.size()) != world_) {
    throw ValueError("topology: " + std::to_string(labels.size()) + " host labels for a communicator of " +
                     std::to_string(world_));
  }
  topo_ = Topology::from_hosts(labels);
  topo_.ring = ring_order_;  // the order the rings really run in (set_ring_order)
  plan_cache_.clear();       // plans of the old topology
  rebuild_model(model_.params());
}

void Communicator::set_cost_params(const CostParams& p) { rebuild_model(p); }

// The model over the current topology and parameters. Every call's family
// is the chooser's pick (resolve_algo), small synchronous all_reduce calls
// included: they run the one-shot plan when the model picks it.
void Communicator::rebuild_model(CostParams params) {
  ModelLimits lim;
  lim.slot_bytes = config_.slot_bytes;
  lim.oneshot_max_bytes = config_.oneshot_max_bytes;
  lim.check_agreement = config_.check_agreement;
  model_ = CostModel(topo_, std::move(params), lim);
  memo_.valid = false;  // picks of the old model
}

std::vector<std::pair<std::string, double>> Communicator::explain(OpKind kind, size_t nbytes) const {
  ChoiceCall call;
  call.kind = kind;
  call.bytes = nbytes;
  std::vector<std::pair<std::string, double>> out;
  for (const Candidate& c : candidates(choice_context(kind), call)) out.emplace_back(algo_name(c.algo), c.seconds);
  return out;
}

void Communicator::finish_init() {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    const bool by_tcp = tcp_ && tcp_->reaches(p);
    if (!by_tcp && !shm_->reaches(p)) {
      throw Error("ringcomm: rank " + std::to_string(rank_) + " has no way to reach rank " + std::to_string(p) +
                  " (no shared segment and no TCP connection): the ranks' records in the store disagree");
    }
  }
}

int Communicator::listen_tcp(const std::string& host) {
  if (!tcp_) tcp_ = std::make_unique<TcpTransport>(rank_, world_, config_.slot_bytes, config_.nslots, shm_.get());
  return tcp_->listen(host);
}

void Communicator::connect_tcp(const std::vector<std::string>& hosts, const std::vector<int>& ports,
                               const std::string& secret) {
  if (!tcp_) throw Error("ringcomm: connect_tcp before listen_tcp");
  if (std::all_of(hosts.begin(), hosts.end(), [](const std::string& h) { return h.empty(); })) {
    tcp_.reset();  // every peer shares memory with this rank
    return;
  }
  // TCP links are made when a schedule first uses them (tcp_transport.h);
  // the ring's neighbours are used by nearly every schedule family (ring,
  // chain, and the hops between hosts of the others), so they are connected
  // now, in parallel, and a peer that is gone shows at init. Both ends of a
  // ring edge see it in the same ring order.
  std::vector<int> now;
  const int n = static_cast<int>(ring_order_.size());
  const int pos = static_cast<int>(std::find(ring_order_.begin(), ring_order_.end(), rank_) - ring_order_.begin());
  for (int step : {n - 1, 1}) {
    const int p = ring_order_[(pos + step) % n];
    if (p != rank_ && !hosts[p].empty() && std::find(now.begin(), now.end(), p) == now.end()) now.push_back(p);
  }
  tcp_->connect(hosts, ports, secret, now, deadline_from_now(),
                std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config_.timeout_s)));
  for (int p = 0; p < world_; ++p) {
    if (tcp_->reaches(p)) router_.route(p, tcp_.get());
  }
}

std::string Communicator::transport_of(int peer) const {
  check_rank(peer, world_, "peer");
  if (peer == rank_) return "self";
  return tcp_ && tcp_->reaches(peer) ? "tcp" : "shm";
}

std::string Communicator::error() {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

void Communicator::check_usable() {
  if (closed_ || closing_) throw Error("ringcomm: the communicator is closed");
  if (!error_.empty()) {
    throw Error("ringcomm: the communicator is unusable after an earlier error (" + error_ +
                "); create a new one");
  }
}

Communicator::Call Communicator::collective(OpKind kind, DataType dtype, size_t count,
                                            const char* name) {
  Call c;
  c.kind = kind;
  c.op = name;
  c.tag.kind = static_cast<uint8_t>(kind);
  c.tag.dtype = static_cast<uint8_t>(dtype);
  c.tag.redop = kNoReduce;
  c.tag.count = count;
  return c;
}

// The call a checked descriptor describes (comm/call_check.h holds every rule).
Communicator::Call Communicator::checked(const CallDesc& d) {
  // The in-place ops' rules read only the signature (presence, dtype, op,
  // root, world), so a call with the last one's signature passes as it did:
  // its checked call is reused with this call's buffer. (A training loop
  // repeats its calls; a small all_reduce's check would otherwise cost a
  // fifth of the call.) The memo is taken by one thread at a time; a second
  // thread (itself an error the communicator reports) checks afresh.
  const bool in_place = d.kind == OpKind::kAllReduce || d.kind == OpKind::kBroadcast || d.kind == OpKind::kReduce;
  if (in_place && d.out.present && !check_memo_busy_.exchange(true, std::memory_order_acquire)) {
    CheckMemo& m = check_memo_;
    if (m.valid && m.call.kind == d.kind && m.dtype == d.out.dtype && m.count == d.out.count &&
        m.call.root == (is_rooted(d.kind) ? d.root : -1) && (!d.reduces || m.call.redop == d.op)) {
      Call c = m.call;
      check_memo_busy_.store(false, std::memory_order_release);
      c.a = d.out;
      return c;
    }
    check_memo_busy_.store(false, std::memory_order_release);
  }
  Call c = checked_afresh(d);
  if (in_place && !check_memo_busy_.exchange(true, std::memory_order_acquire)) {
    check_memo_ = {true, d.out.dtype, d.out.count, c};
    check_memo_busy_.store(false, std::memory_order_release);
  }
  return c;
}

Communicator::Call Communicator::checked_afresh(const CallDesc& d) {
  check_call(d);
  Call c = collective(d.kind, call_dtype(d), call_count(d), op_kind_name(d.kind));
  if (d.reduces) {
    c.reducer = make_reducer(call_dtype(d), d.op);
    c.redop = d.op;
    c.reduces = true;
  }
  c.a = d.out;
  c.b = d.in;
  c.model_bytes = call_model_bytes(d);
  // A rooted call's root-only buffer is not used on the other ranks.
  if (d.kind == OpKind::kScatter && rank_ != d.root) c.b = Buffer{};
  if (d.kind == OpKind::kGather && rank_ != d.root) c.a = Buffer{};
  if (is_rooted(d.kind)) {
    c.root = d.root;
    c.tag.root = d.root;
  }
  return c;
}

std::shared_ptr<Work> Communicator::all_reduce(Buffer x, ReduceOp op, bool async) {
  Inside inside(inside_);
  Call c = checked(describe_call(OpKind::kAllReduce, rank_, world_, x, Buffer{}, -1, op));
  return submit(std::move(c), async);
}

std::shared_ptr<Work> Communicator::reduce_scatter(Buffer out, Buffer in, ReduceOp op, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kReduceScatter, rank_, world_, out, in, -1, op)), async);
}

std::shared_ptr<Work> Communicator::all_gather(Buffer out, Buffer in, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kAllGather, rank_, world_, out, in, -1, ReduceOp::kSum)), async);
}

std::shared_ptr<Work> Communicator::broadcast(Buffer x, int src, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kBroadcast, rank_, world_, x, Buffer{}, src, ReduceOp::kSum)), async);
}

std::shared_ptr<Work> Communicator::reduce(Buffer x, int dst, ReduceOp op, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kReduce, rank_, world_, x, Buffer{}, dst, op)), async);
}

std::shared_ptr<Work> Communicator::scatter(Buffer out, Buffer in, int src, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kScatter, rank_, world_, out, in, src, ReduceOp::kSum)), async);
}

std::shared_ptr<Work> Communicator::gather(Buffer out, Buffer in, int dst, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kGather, rank_, world_, out, in, dst, ReduceOp::kSum)), async);
}

std::shared_ptr<Work> Communicator::all_to_all(Buffer out, Buffer in, bool async) {
  Inside inside(inside_);
  return submit(checked(describe_call(OpKind::kAllToAll, rank_, world_, out, in, -1, ReduceOp::kSum)), async);
}

Communicator::Call Communicator::p2p_call(const Buffer& x, int peer, int64_t tag, bool is_send) {
  check_call(describe_p2p(is_send, rank_, world_, x, peer));
  Call c = collective(OpKind::kSend, x.dtype, x.count, is_send ? "send" : "recv");
  c.a = x;
  c.root = peer;
  c.is_send = is_send;
  c.p2p_tag = tag;
  c.tag.p2p_tag = tag;
  return c;
}

std::shared_ptr<Work> Communicator::send(Buffer x, int dst, int64_t tag, bool async) {
  Inside inside(inside_);
  return submit(p2p_call(x, dst, tag, true), async);
}

std::shared_ptr<Work> Communicator::recv(Buffer x, int src, int64_t tag, bool async, int* source) {
  Inside inside(inside_);
  return submit(p2p_call(x, src, tag, false), async, source);
}

std::shared_ptr<Work> Communicator::barrier(bool async) {
  Inside inside(inside_);
  Call c = collective(OpKind::kBarrier, DataType::kUInt8, 0, "barrier");
  return submit(std::move(c), async);
}

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
    const std::string other = running_ ? std::string(running_name_) : std::string(queue_.front().first.name());
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

void Communicator::record(const Call& c, CallState state) {
  CallRecordView r;
  r.kind = static_cast<uint8_t>(c.kind);
  r.state = static_cast<uint8_t>(state);
  r.p2p = c.kind == OpKind::kSend ? (c.is_send ? 1 : 2) : 0;
  r.peer = c.kind == OpKind::kSend ? c.root : -1;
  r.seq = c.tag.seq;
  router_.record_call(r);
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

std::vector<std::string> Communicator::in_flight() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::string> out;
  if (running_) out.push_back(running_name_);
  for (const Item& it : queue_) out.push_back(std::string(it.first.name()) + " (seq " + std::to_string(it.first.tag.seq) + ")");
  return out;
}

// Queues a call for the worker (or a thread that helps). Holds mu_ via lk,
// which it releases. `notify`: wake the worker; a caller that is about to
// wait on the call itself leaves it asleep (its wait runs the call, and a
// busy worker takes queued calls without being woken).
std::shared_ptr<Work> Communicator::enqueue(Call call, std::unique_lock<std::mutex>& lk, bool notify) {
  record(call, CallState::kIssued);  // (a call run inline goes straight to kRunning)
  auto work = std::make_shared<Work>(call.name(), waiters_);
  work->set_helper([this, w = work.get()] { help(w); });
  work->set_on_interrupt([this](const std::string& why) { abort(why); });
  queue_.emplace_back(std::move(call), work);
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  if (notify) cv_.notify_all();
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

void Communicator::sendrecv(Buffer send_buf, int dst, Buffer recv_buf, int src) {
  Inside inside(inside_);
  P2pMember m[2];
  m[0].call = p2p_call(send_buf, dst, 0, true);
  m[1].call = p2p_call(recv_buf, src, 0, false);
  std::unique_lock<std::mutex> lk(mu_);
  check_usable();
  assign_seq(m[0].call);
  assign_seq(m[1].call);
  if (queue_.empty() && !running_) {
    // Both run in this thread as one group (the latency path).
    running_ = true;
    running_name_ = "sendrecv";  // (a literal: no string built per call)
    lk.unlock();
    Work ws(m[0].call.op), wr(m[1].call.op);  // never waited on
    m[0].work = &ws;
    m[1].work = &wr;
    execute_p2p(m, 2, false);
    release_inline();
    ws.rethrow();
    wr.rethrow();
    return;
  }
  // Behind queued calls: both join the worker's send/recv group.
  auto ws = enqueue(std::move(m[0].call), lk, true);
  lk.lock();
  auto wr = enqueue(std::move(m[1].call), lk, true);
  ws->wait(-1);
  wr->wait(-1);
}

std::shared_ptr<Work> Communicator::submit(Call&& call, bool async, int* source) {
  std::unique_lock<std::mutex> lk(mu_);
  check_usable();
  assign_seq(call);
  if (!async && queue_.empty() && !running_) {
    // The latency path: run in this thread, no allocation, no hand-off.
    running_ = true;
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
void Communicator::run_front(std::unique_lock<std::mutex>& lk) {
  auto item = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  running_owned_ = std::string(item.first.name()) + " (seq " + std::to_string(item.first.tag.seq) + ")";
  running_name_ = running_owned_.c_str();
  lk.unlock();
  if (item.first.kind == OpKind::kSend) {
    P2pMember m;
    m.call = std::move(item.first);
    m.work = item.second.get();
    m.keep = std::move(item.second);
    execute_p2p(&m, 1, true);
  } else {
    execute(item.first, *item.second);
  }
  lk.lock();
  running_ = false;
  if (!queue_.empty()) cv_.notify_all();  // the worker waits for queued calls only
}

void Communicator::worker_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  auto ready = [&] { return (stop_ && queue_.empty()) || (!queue_.empty() && !running_); };
  for (;;) {
    // No polling here: a caller that waits soon runs the call itself (help),
    // and the worker's wake-up (tens of microseconds) only matters for calls
    // left to progress in the background, which are the large ones.
    cv_.wait(lk, ready);
    if (queue_.empty()) {
      worker_done_ = true;
      closed_cv_.notify_all();
      return;
    }
    run_front(lk);
  }
}

// A thread waiting for `work` runs the queue itself while nobody else does:
// handing a call to the worker and back costs two thread wake-ups (tens of
// microseconds on a VM), more than a small call takes. Order is kept: calls
// still run one at a time, oldest first.
//
// Not a send/recv group, though: a group runs until every member is done,
// and an isend in it may wait for a recv that only this thread is yet to
// issue (isend, isend, then a blocking recv, on both ranks, with more bytes
// than the FIFO holds: each thread would run its group forever, waiting for
// the other's next recv). The worker runs groups; this thread's call joins
// the group and returns when it is done.
void Communicator::help(const Work* work) {
  Inside inside(inside_);
  std::unique_lock<std::mutex> lk(mu_);
  if (closing_) return;  // the worker drains (or fails) what is queued
  while (!work->is_completed() && !running_ && !queue_.empty()) {
    if (queue_.front().first.kind == OpKind::kSend) {
      cv_.notify_all();
      return;
    }
    run_front(lk);
  }
}

const Plan& Communicator::plan(Call& c, size_t* out_bytes_out) {
  const size_t elem = dtype_size(static_cast<DataType>(c.tag.dtype));
  // Both buffers hold the call's dtype (the entry points check it).
  const size_t out_bytes = c.a.count * elem, in_bytes = c.b.count * elem;
  *out_bytes_out = out_bytes;
  CallPlan call;
  call.kind = c.kind;
  call_buffers(c.a.ptr, out_bytes, c.b.ptr, in_bytes, &call);
  const bool avg = c.reduces && c.redop == ReduceOp::kAvg;
  PlanMemo& m = memo_;
  if (m.valid && m.kind == c.kind && m.dtype == c.tag.dtype && m.avg == avg && m.root == c.root &&
      m.a_count == c.a.count && m.b_count == c.b.count && m.out == call.out && m.in == call.in &&
      m.generation == plan_cache_.generation()) {
    plan_cache_.count_hit();
    c.tag.algo = m.plan->family;
    return *m.plan;
  }
  const size_t slice = ring_slice_elems(config_.slot_bytes, config_.nslots, elem);
  PlanContext ctx{rank_, world_, elem, slice, nullptr};
  ctx.topo = &topo_;
  if (!ring_identity_) {
    ctx.ring = ring_order_.data();
    ctx.ring_pos = ring_pos_;
  }
  const bool by_input = c.kind == OpKind::kAllGather || c.kind == OpKind::kGather || c.kind == OpKind::kAllToAll;
  call.count = by_input ? c.b.count : c.a.count;
  call.root = c.root;
  call.avg = avg;
  if (c.kind != OpKind::kBarrier) call.algo = resolve_algo(c);
  const size_t need = scratch_bytes(call, elem, world_);
  if (scratch_.size() < need) scratch_.resize(need);
  const Plan& p = plan_cache_.plan(ctx, call);
  c.tag.algo = p.family;
  m.valid = plan_cache_.kept(p);
  m.kind = c.kind;
  m.dtype = c.tag.dtype;
  m.avg = avg;
  m.root = c.root;
  m.a_count = c.a.count;
  m.b_count = c.b.count;
  m.out = call.out;
  m.in = call.in;
  m.generation = plan_cache_.generation();
  m.plan = &p;
  return p;
}

Algo Communicator::resolve_algo(const Call& c) const { return resolve_algo(c.kind, c.model_bytes); }

// What `auto` (or a forced choice this rank cannot run) means for a call:
// the chooser (comm/chooser.h), from what every rank knows alike (the
// configuration, the size, whether every rank can pull, the topology and
// the agreed cost model), so that all ranks pick the same family.
ChoiceContext Communicator::choice_context(OpKind kind) const {
  ChoiceContext ctx;
  ctx.device = Device::kCpu;
  ctx.configured = algos_.of(kind);
  ctx.model = &model_;
  ctx.pull_ok = pull_ok_;
  return ctx;
}

Algo Communicator::resolve_algo(OpKind kind, size_t bytes) const {
  ChoiceCall call;
  call.kind = kind;
  call.bytes = bytes;
  return choose(choice_context(kind), call);
}

// Rooted schedules do not make every rank hear from every other (a chain
// broadcast's root hears from nobody), so ranks that disagree on the root
// could all return "successfully" with different data. Before a rooted
// call's data moves, the ranks run the dissemination barrier carrying each
// rank's call (a 39-bit hash of its header: kind, dtype, op, family, root,
// seq, count) and its rank, folded by minimum: two words, the smallest hash
// with its rank and the largest (complemented) with its. After ceil(log2 n)
// rounds every rank holds the same two words, so either every rank goes on
// or every rank raises, naming two ranks whose calls differ. Each message's
// header is also checked against the receiver's call (executor), so the
// ranks next to a disagreeing one raise at once with both calls described,
// and tell the others. log2 n peers a rank, the barrier's: not the full mesh
// of connections that checking every pair would open (docs/errors.md).
void Communicator::agree_on_call(const Call& c, Clock::time_point deadline, const CallInfo& info) {
  if (world_ == 1) return;
  const MsgTag& t = c.tag;
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (uint64_t x : {uint64_t(t.kind), uint64_t(t.dtype), uint64_t(t.redop), uint64_t(t.algo),
                     uint64_t(uint32_t(t.root)), t.seq, t.count}) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  // Ranks below 2^24, the hash in the 39 bits above: the words stay below
  // 2^63, so the int64 minimum the run reduces with orders them as unsigned.
  constexpr int kRankBits = 24;
  constexpr uint64_t kRankMask = (1ull << kRankBits) - 1, kHashMask = (1ull << (63 - kRankBits)) - 1;
  h &= kHashMask;
  const uint64_t me = static_cast<uint64_t>(rank_) & kRankMask;
  agreement_state_[0] = (h << kRankBits) | me;
  agreement_state_[1] = ((~h & kHashMask) << kRankBits) | me;
  if (agreement_schedule_.empty()) {
    PlanContext ctx{rank_, world_, sizeof(uint64_t), 1, &agreement_schedule_};
    agreement_result_ = dissemination_agreement(ctx, {kState, 0});
  }
  PlanBuffers bufs;
  bufs.base[kState] = reinterpret_cast<char*>(agreement_state_);
  static const Reducer minimum = make_reducer(DataType::kInt64, ReduceOp::kMin);
  executor_.run(agreement_schedule_, bufs, c.tag, &minimum, deadline, info);
  const uint64_t* got = agreement_state_ + agreement_result_.offset / sizeof(uint64_t);
  const uint64_t lo = got[0] >> kRankBits, hi = ~(got[1] >> kRankBits) & kHashMask;
  if (lo != hi) {
    throw MismatchError("ringcomm: mismatched calls: ranks " + std::to_string(got[0] & kRankMask) + " and " +
                        std::to_string(got[1] & kRankMask) + " issued different calls where rank " +
                        std::to_string(rank_) + " is in " + describe_tag(c.tag) +
                        " (the root, count, dtype, op or algorithm differ); all ranks must issue the same "
                        "collectives in the same order");
  }
}

void Communicator::run_call(Call& c) {
  size_t out_bytes;
  const Plan& p = plan(c, &out_bytes);
  const CallInfo info = info_of(c);
  const Clock::time_point deadline = deadline_from_now();
  if (is_rooted(c.kind) && config_.check_agreement) agree_on_call(c, deadline, info);
  executor_.set_streaming(out_bytes >= kStreamingCopyMinBytes);  // c.a: the output
  PlanBuffers bufs;
  bufs.base[kOut] = c.a.ptr;
  bufs.base[kIn] = c.b.ptr;
  bufs.base[kScratch] = scratch_.data();
  bufs.base[kAddrs] = reinterpret_cast<char*>(addrs_.data());
  executor_.run(p.steps, bufs, c.tag, c.reduces ? &c.reducer : nullptr, deadline, info, nullptr, p.flat);
}

void Communicator::execute(Call& c, Work& work) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_.empty()) {
      work.fail(Work::ErrorKind::kError,
                "ringcomm: " + std::string(c.name()) + " was not run: the communicator failed earlier (" + error_ + ")");
      return;
    }
  }
  Work::ErrorKind kind = Work::ErrorKind::kNone;
  std::string message;
  record(c, CallState::kRunning);
  try {
    run_call(c);
    record(c, CallState::kFinished);
    work.complete();
    return;
  } catch (const std::exception& e) {
    kind = error_kind_of(e);
    message = e.what();
  }
  record(c, CallState::kFailed);
  fail(message);
  work.fail(kind, message);
}

// submit() checked under mu_ that the communicator is usable and claimed it
// (running_); the caller releases it.
void Communicator::run_inline(Call& c) {
  record(c, CallState::kRunning);
  try {
    run_call(c);
  } catch (const std::exception& e) {
    record(c, CallState::kFailed);
    fail(e.what());
    throw;
  }
  record(c, CallState::kFinished);
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

// Consecutive send/recv calls run as one group whose operations progress
// together, as isend/irecv do in torch.distributed: a large isend never
// blocks the irecv issued after it (which would deadlock two ranks that
// exchange). Calls queued while the group runs join it (`take_queued`: the
// worker's groups); the group ends when every member is done and the next
// queued call (if any) is a collective, so issue order between collectives
// and point-to-point calls is kept. Matching (tags, any source) and the
// messages held between groups are the matcher's (comm/p2p_match.cpp).
void Communicator::post_p2p(P2pMember& m) {
  Call& c = m.call;
  m.deadline = deadline_from_now();
  record(c, CallState::kRunning);
  const uint8_t dtype = static_cast<uint8_t>(c.a.dtype);
  m.op = c.is_send ? matcher_.post_send(c.a.ptr, c.a.nbytes(), dtype, c.a.count, c.root, c.p2p_tag, c.tag.seq)
                   : matcher_.post_recv(c.a.ptr, c.a.nbytes(), dtype, c.a.count, c.root, c.p2p_tag, c.tag.seq);
}

void Communicator::execute_p2p(P2pMember* first, size_t n, bool take_queued) {
  std::vector<P2pMember>& group = p2p_group_;
  group.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_.empty()) {
      for (size_t i = 0; i < n; ++i) {
        first[i].work->fail(Work::ErrorKind::kError, "ringcomm: " + std::string(first[i].call.name()) +
                                                         " was not run: the communicator failed earlier (" + error_ + ")");
      }
      return;
    }
  }
  // The deadline and the timeout's words are those of the oldest unfinished member.
  size_t ndone = 0, oldest = 0, described = SIZE_MAX;
  Clock::time_point deadline;
  CallInfo info;
  auto point_at_oldest = [&] {
    while (oldest < group.size() && group[oldest].done) ++oldest;
    if (oldest < group.size() && described != oldest) {
      described = oldest;
      deadline = group[oldest].deadline;
      info = info_of(group[oldest].call);
    }
  };
  // Completes finished members, takes newly queued send/recv calls.
  auto step = [&] {
    bool moved = matcher_.progress();
    for (P2pMember& m : group) {
      if (m.done || !m.op->complete) continue;
      m.done = true;
      ++ndone;
      record(m.call, CallState::kFinished);
      if (!m.call.is_send) m.work->set_source(m.op->source);
      matcher_.finish(m.op);
      m.op = nullptr;
      m.work->complete();
      moved = true;
    }
    if (take_queued) {
      std::lock_guard<std::mutex> lk(mu_);
      while (!queue_.empty() && queue_.front().first.kind == OpKind::kSend) {
        group.emplace_back();
        described = SIZE_MAX;  // the group may have moved: `info` names the oldest's call again
        P2pMember& m = group.back();
        m.call = std::move(queue_.front().first);
        m.keep = std::move(queue_.front().second);
        m.work = m.keep.get();
        queue_.pop_front();
        post_p2p(m);
        moved = true;
      }
    }
    if (moved) point_at_oldest();
    return moved;
  };
  try {
    for (size_t i = 0; i < n; ++i) {
      group.push_back(std::move(first[i]));
      post_p2p(group.back());
    }
    point_at_oldest();
    executor_.drive(step, [&] { return ndone == group.size(); }, deadline, info, [&] {
      const P2pMember& m = group[oldest];
      executor_.throw_timeout(info, matcher_.waiting_text(*m.op));
    });
    group.clear();
    return;
  } catch (const std::exception& e) {
    fail(e.what());
    const Work::ErrorKind kind = error_kind_of(e);
    for (P2pMember& m : group) {
      if (!m.done) {
        record(m.call, CallState::kFailed);
        m.work->fail(kind, e.what());
      }
    }
    matcher_.reset();
    for (P2pMember& m : group) matcher_.finish(m.op);
    // Members not posted yet (the error came while posting).
    for (size_t i = group.size(); i < n; ++i) first[i].work->fail(kind, e.what());
  }
  group.clear();
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
    error_ = "the communicator was closed by another thread while " + (running_ ? running_name_ : std::string("a call")) +
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

void Communicator::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.empty()) error_ = "aborted: " + why;
  }
  std::lock_guard<std::mutex> life(life_mu_);
  if (!released_) router_.announce_abort("rank " + std::to_string(rank_) + " aborted: " + why);
}

}  // namespace ringcomm
