// The communicator: the one place that wires a transport to the schedules.
//
// Calls are checked once (comm/call_check.h), numbered in issue order, and
// then run either inline in the calling thread (synchronous calls with
// nothing queued: the latency path) or by one worker thread per
// communicator (asynchronous calls, executed in issue order). The class is
// defined across files, one concern each:
//   communicator.cpp         construction, the error state, abort, close
//   communicator_setup.cpp   the shm inbox, TCP links, ring order, topology, cost model
//   communicator_calls.cpp   the public calls, described and checked
//   communicator_queue.cpp   numbering, the thread rule, the queue, the worker, the inline path
//   communicator_run.cpp     the chooser's pick, the plan, the executor run; explain
//   communicator_agree.cpp   rooted calls' agreement on the call; the tuner's agreements
//   communicator_p2p.cpp     send/recv groups and sendrecv
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <atomic>
#include <vector>

#include "algo/schedules.h"
#include "algo/step.h"
#include "comm/algo_choice.h"
#include "comm/buffer.h"
#include "comm/call_queue.h"
#include "comm/call_check.h"
#include "comm/autotune.h"
#include "comm/chooser.h"
#include "comm/cost_model.h"
#include "comm/describe.h"
#include "comm/executor.h"
#include "comm/p2p_match.h"
#include "comm/plan_cache.h"
#include "comm/work.h"
#include "transport/router.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace ringcomm {

// The Work error kind an exception of a failed call maps to.
Work::ErrorKind error_kind_of(const std::exception& e);

struct Config {
  size_t slot_bytes = 128 * 1024;       // bytes per FIFO slot (one pipelined segment)
  int nslots = 16;                      // slots per FIFO (segments in flight per peer)
  // auto | one name for every op that has it | op:name,... (comm/algo_choice.h)
  std::string algo = "auto";
  size_t oneshot_max_bytes = 64 * 1024;  // auto: one-shot all_reduce up to this size
  bool pull = true;                     // single-copy pull schedules where the OS allows
  size_t pull_min_bytes = 16 << 20;     // send/recv of at least this size pull
  // Bytes of messages received before their recv was posted that this rank
  // holds, all peers together (comm/p2p_match.cpp).
  size_t p2p_unexpected_bytes = size_t{256} << 20;
  double timeout_s = 300.0;
  std::string transport = "auto";       // bootstrap: auto (TCP to other hosts) | shm | tcp (every peer)
  // Rooted calls (broadcast, reduce, scatter, gather) first check that all
  // ranks issued the same call (agree_on_call), so ranks that disagree on the
  // root (or on anything else) all raise CollectiveMismatchError before any
  // returns.
  bool check_agreement = true;
  // The cost model's parameters (Python reads this; comm/calibrate.cpp):
  // "measure" at init, "default", or a file `ringcomm-bench --calibrate` wrote.
  std::string cost_model = "measure";
  // The ring's order: "host" (host-contiguous) or "rank" (rank order, for
  // comparison: every hop of an interleaved placement crosses the network).
  std::string ring_order = "host";
  // Plans kept per call signature and run as they stand on each call's buffers
  // (comm/plan_cache.h); 0: every call is planned afresh.
  size_t plan_cache_entries = PlanCache::kDefaultEntries;
  // `auto` checked against the calls' own times (comm/autotune.h).
  bool autotune = true;
  // How shared-memory slots are written: auto | cached | streamed
  // (transport/shm/slot_stores.h).
  std::string slot_stores = "auto";
  WaitPolicy wait;
};

class Communicator {
 public:
  Communicator(int rank, int world, Config config);
  ~Communicator();

  int rank() const { return rank_; }
  int world() const { return world_; }
  const Config& config() const { return config_; }

  // Bootstrap (the store exchange happens in Python): after the host census,
  // this rank's inbox for the ranks that reach it over shared memory (its
  // name, "" when it has no such peer), then every rank's name ("" for peers
  // on other hosts), then the unlink once all local peers mapped it, and
  // finish_init once TCP is connected too.
  std::string create_segment(const std::vector<int>& members);
  std::string segment_name() const { return shm_->segment_name(); }
  void connect(const std::vector<std::string>& segment_names);
  void unlink_segment() { shm_->unlink(); }
  // Checks that every peer is reached by some transport.
  void finish_init();
  // Peers that share no memory with this rank are reached over TCP: listen
  // first (the port is published through the store), then connect to every
  // peer p with a non-empty hosts[p] once all ranks have published. `secret`
  // (32 random bytes, the same on every rank) authenticates the connections.
  // With no such peer, connect_tcp just closes the listener.
  int listen_tcp(const std::string& host);
  void connect_tcp(const std::vector<std::string>& hosts, const std::vector<int>& ports,
                   const std::string& secret);
  // "shm" or "tcp": how this rank reaches `peer` ("self" for this rank).
  std::string transport_of(int peer) const;
  // Data frames this rank received over TCP: {read by the I/O thread, read
  // by the calling thread itself}; {0, 0} without TCP peers.
  std::pair<uint64_t, uint64_t> tcp_frames_read() const {
    return tcp_ ? std::make_pair(tcp_->frames_read_by_io(), tcp_->frames_read_by_caller())
                : std::make_pair(uint64_t{0}, uint64_t{0});
  }
  // Large data frames that moved without a copy through a slot: {sent from
  // the caller's memory (Link::send_ref), read straight into it
  // (Link::post_recv)}; {0, 0} without TCP peers.
  std::pair<uint64_t, uint64_t> tcp_frames_in_place() const {
    return tcp_ ? std::make_pair(tcp_->frames_sent_by_ref(), tcp_->frames_landed())
                : std::make_pair(uint64_t{0}, uint64_t{0});
  }
  // How many times this rank published its cost of reading `peer`'s
  // shared-memory slots (ShmTransport::read_cost_updates).
  uint64_t slot_read_cost_updates(int peer) const { return shm_ ? shm_->read_cost_updates(peer) : 0; }
  // Whether this rank can read every peer's memory (cross-memory attach);
  // all ranks must then agree (set_pull) before pull schedules are used.
  bool probe_pull() { return shm_->probe_remote_read() && router_.can_read_remote(); }
  void set_pull(bool on);
  // More ranks than cores on this host: spinning only delays the peer that
  // should run, so waits yield at once (set before the first call).
  void set_wait_policy(WaitPolicy policy) { executor_.set_policy(policy); }
  bool pull_enabled() const { return pull_ok_; }
  // The ring's order (position -> rank) for ring and chain schedules: the
  // ranks of each host next to each other (set from the host census before
  // the first call; every rank must set the same permutation).
  void set_ring_order(const std::vector<int>& order);
  const std::vector<int>& ring_order() const { return ring_order_; }
  // Who runs where (each rank's host label, equal labels: one host; the
  // same on every rank): the hierarchical schedules and the cost model use
  // it. Set with the ring order, before the first call.
  void set_topology(const std::vector<int>& host_labels);
  const Topology& topology() const { return topo_; }
  // Calibration (comm/calibrate.cpp), a call of every rank: this rank
  // measures its link to intra_peer, then to inter_peer (-1: none; each
  // pair's partners pass each other), rank gamma_rank times its reduction;
  // returns [intra alpha, beta, overhead, inter alpha, beta, overhead,
  // gamma], NaN for what this rank did not measure.
  std::vector<double> measure_links(int intra_peer, int inter_peer, int gamma_rank);
  // Parameters every rank agreed on (python/ringcomm/cost_model.py agree()).
  void set_cost_params(const CostParams& p);
  const CostModel& cost_model() const { return model_; }
  // How often a call's plan came from the plan cache (any thread may ask).
  PlanCacheStats plan_cache_stats() const { return plan_cache_.stats(); }
  // Every candidate for a call of `kind` moving `nbytes` (the size
  // nccl-tests reports) with its predicted seconds, what the call would run
  // first (forced, tuned or picked; NaN: not modelled, e.g. pull).
  std::vector<std::pair<std::string, double>> explain(OpKind kind, size_t nbytes) const;
  // What the tuner measured and keeps, per call signature (any thread may ask).
  std::vector<AutoTuner::Report> tuning() const { return tuner_.report(); }

  // Every call returns the Work when `async`, nullptr after a synchronous
  // call completed (its error is thrown).
  std::shared_ptr<Work> all_reduce(Buffer x, ReduceOp op, bool async);
  std::shared_ptr<Work> reduce_scatter(Buffer out, Buffer in, ReduceOp op, bool async);
  std::shared_ptr<Work> all_gather(Buffer out, Buffer in, bool async);
  std::shared_ptr<Work> broadcast(Buffer x, int src, bool async);
  std::shared_ptr<Work> reduce(Buffer x, int dst, ReduceOp op, bool async);
  std::shared_ptr<Work> scatter(Buffer out, Buffer in, int src, bool async);
  std::shared_ptr<Work> gather(Buffer out, Buffer in, int dst, bool async);
  std::shared_ptr<Work> all_to_all(Buffer out, Buffer in, bool async);
  // Point to point, matched by (source, tag) as in MPI (comm/p2p_match.cpp).
  // recv's src may be kAnySource; a synchronous recv stores the rank the
  // message came from in *source (when given), an asynchronous one in its
  // Work (Work::source).
  std::shared_ptr<Work> send(Buffer x, int dst, int64_t tag, bool async);
  std::shared_ptr<Work> recv(Buffer x, int src, int64_t tag, bool async, int* source = nullptr);
  std::shared_ptr<Work> barrier(bool async);
  // Sends to dst and receives from src at once (both progress together, as
  // in a batch_isend_irecv of two); returns when both are done. Tag 0.
  void sendrecv(Buffer send_buf, int dst, Buffer recv_buf, int src);

  // Releases the communicator; safe from any thread and idempotent. Calls
  // that a thread is running or waiting for right now are aborted (they
  // raise within milliseconds); queued asynchronous calls nobody waits for
  // are completed first (bounded by the timeout); then the worker stops,
  // the peers are told this rank left, and the segments are unmapped.
  void close();
  // Fails this communicator now and tells the peers (they fail fast too);
  // a call blocked in another thread raises within milliseconds.
  void abort(const std::string& why);
  // abort() as a revoke: every rank's calls in flight and later raise
  // RevokedError (the peers hear of it as of an abort).
  void revoke(const std::string& why);
  // Why `peer` is known to be gone ("" if not known; Transport::peer_gone).
  std::string peer_gone(int peer);
  bool closed() const { return closed_; }
  // Non-empty once an operation failed: later calls are refused.
  std::string error();
  // The calls issued and not finished ("all_reduce (seq 4)"), oldest first.
  std::vector<std::string> in_flight();

 private:
  struct Call {
    OpKind kind;
    MsgTag tag;
    std::thread::id issuer;
    ReduceOp redop = ReduceOp::kSum;
    bool reduces = false;
    Reducer reducer{};  // chosen (and checked) when the call is validated
    int root = -1;  // root, or the peer of send/recv (kAnySource: a recv from any)
    bool is_send = false;
    // The check memo's calls (checked): the plan their signature ran last
    // time, kept by plan_cache_ while its generation is `plan_generation`,
    // so that run_call() runs it without asking plan(). `memo_owner`: a
    // call the memo's thread runs inline (submit), which plan() may
    // teach the memo its plan; a queued call (another thread runs it) may not.
    const Plan* plan = nullptr;
    uint64_t plan_generation = 0;
    bool memo_owner = false;
    int64_t p2p_tag = 0;
    Buffer a, b;    // a: in-place buffer or output, b: input
    size_t model_bytes = 0;  // the call's size as the cost model counts it (call_model_bytes)
    // Queued calls: when the worker may take it (the hand-off rule in
    // communicator_queue.cpp); the epoch: at once.
    Clock::time_point due{};
    // What errors and records call it: the op's name (a literal), or for
    // send/recv "send to rank 2 (tag 5)", built when it is numbered. A
    // collective's call builds no string.
    const char* op = "";
    // Built at the first name() of a send/recv (errors, queued calls); held
    // inline, so that a Call copies as plain bytes ("recv from rank
    // 2147483647 (tag -9223372036854775808)" fits).
    mutable char p2p_name[64] = {};
    const char* name() const {
      if (kind != OpKind::kSend) return op;
      if (!p2p_name[0]) {
        const std::string s = p2p_call_name(is_send, root, p2p_tag);
        s.copy(p2p_name, sizeof(p2p_name) - 1);
      }
      return p2p_name;
    }
  };

  static_assert(std::is_trivially_copyable<Call>::value,
                "a Call is copied on every call (the check memo): keep it plain bytes");

  using Item = std::pair<Call, std::shared_ptr<Work>>;

  std::shared_ptr<Work> submit(Call&& call, bool async, int* source = nullptr);
  // Gives the communicator back after a call run inline by the calling
  // thread (submit and sendrecv take it under mu_ when nothing is queued).
  void release_inline();
  void assign_seq(Call& call);
  std::shared_ptr<Work> enqueue(Call call, std::unique_lock<std::mutex>& lk, bool async);
  // `failed_earlier`: error_ as run_front read it (the call fails at once).
  void execute(Call& call, Work& work, const std::string& failed_earlier);
  // Runs a collective (or the barrier): plans it (the plan cache), agrees on
  // it (rooted calls), runs its plan over its buffers; throws its error.
  void run_call(Call& call);
  // A synchronous collective run by the calling thread (submit's latency
  // path): no Work, the error thrown as it is; the communicator is poisoned
  // if it throws.
  void run_inline(Call& call);
  // A send/recv group (see communicator.cpp): `first` are its first members
  // (a call and the Work it completes, `keep` owning it when queued).
  struct P2pMember {
    Call call;
    Work* work = nullptr;
    std::shared_ptr<Work> keep;
    P2pOp* op = nullptr;
    Clock::time_point deadline;
    bool done = false;
  };
  void execute_p2p(P2pMember* first, size_t n, bool take_queued);
  void post_p2p(P2pMember& m);
  Call p2p_call(const Buffer& x, int peer, int64_t tag, bool is_send);
  void fail(const std::string& message);
  Clock::time_point deadline_from_now() const;
  // The call's plan (kept by plan_cache_; valid until the next plan());
  // sets call.tag.algo to its family and *out_bytes to its output's size.
  const Plan& plan(Call& call, size_t* out_bytes);
  void teach_check_memo(const Call& c, const Plan& p);
  Algo resolve_algo(const Call& c) const;
  Algo resolve_algo(OpKind kind, size_t model_bytes) const;
  ChoiceContext choice_context(OpKind kind) const;
  // The model over topo_ with `params` (a copy: it may be model_'s own).
  void rebuild_model(CostParams params);
  void worker_loop();
  // Runs the oldest queued call; `take_queued`: a send/recv group takes the
  // send/recv calls queued while it runs (the worker's groups).
  void run_front(std::unique_lock<std::mutex>& lk, bool take_queued = true);
  // A thread that waits for `work` (`may_run`: without a time limit).
  void help(const Work* work, bool may_run);
  void check_usable();
  // Holds mu_: the thread rule (see communicator.cpp) for a call issued now.
  void check_thread(const Call& call);
  void record(const Call& c, CallState state) {
    CallRecordView r;
    r.kind = static_cast<uint8_t>(c.kind);
    r.state = static_cast<uint8_t>(state);
    r.p2p = c.kind == OpKind::kSend ? (c.is_send ? 1 : 2) : 0;
    r.peer = c.kind == OpKind::kSend ? c.root : -1;
    r.seq = c.tag.seq;
    router_.record_call(r);
  }
  CallInfo info_of(const Call& c) const;
  // Rooted calls: every rank checks, before the data moves, that all ranks
  // issued this same call (raises MismatchError on every rank if not).
  void agree_on_call(const Call& c, Clock::time_point deadline, const CallInfo& info);
  // The minimum over all ranks of two words (the dissemination rounds of
  // agree_on_call, within call c's messages); returns them.
  const int64_t* agree_minimum(int64_t w0, int64_t w1, const MsgTag& tag, Clock::time_point deadline,
                               const CallInfo& info);
  // After call c ran from `start`: the tuner's sample, and its agreement
  // when a window completes (comm/autotune.h).
  void tune_after(const Call& c, Clock::time_point start, Clock::time_point deadline, const CallInfo& info);
  // A thread inside a call of this communicator (close() waits for it to leave).
  // The thread also notes which communicators it is inside (a signal
  // handler run by a wait of this call must not close() it under its feet).
  struct Inside {
    explicit Inside(std::atomic<int>& n);
    ~Inside();
    std::atomic<int>& n_;
    std::vector<const std::atomic<int>*>* mine_;  // this thread's list (thread_inside), looked up once
    bool sole;  // no other thread was inside when this one entered
  };
  static bool thread_inside(const std::atomic<int>* counter);
  Call collective(OpKind kind, DataType dtype, size_t count, const char* name);
  // The call `d` describes, checked (comm/call_check.h); checked_afresh
  // always runs the check, checked reuses the last in-place op's result.
  Call checked(const CallDesc& d, bool sole);
  Call checked_afresh(const CallDesc& d, bool memo);  // memo: keep the result in check_memo_
  Call memo_call(const Buffer& x) const;               // check_memo_'s call over buffer x

  const int rank_;
  const int world_;
  const Config config_;
  const AlgoChoice algos_;  // config_.algo, parsed once
  std::unique_ptr<ShmTransport> shm_;  // this rank's inbox + doorbell, and same-host peers
  std::unique_ptr<TcpTransport> tcp_;  // peers on other hosts (or all, when forced); may be null
  Router router_;                      // which transport reaches which peer
  Executor executor_;
  PlanCache plan_cache_;        // what plan() built, per call signature
  const Clock::duration timeout_;  // config_.timeout_s (deadline_from_now)
  // The last call's signature and its kept plan (a loop repeats one call:
  // it takes the plan without asking the chooser or the cache again).
  // Valid while `valid` and the cache's generation are unchanged; reset when
  // what the chooser's pick depends on changes (rebuild_model, set_pull).
  struct PlanMemo {
    bool valid = false;
    OpKind kind = OpKind::kBarrier;
    uint8_t dtype = 0;
    bool avg = false;
    int root = -1;
    size_t a_count = 0, b_count = 0;
    BufRef out, in;  // the buffers' form (CallPlan::out / ::in)
    uint64_t generation = 0;
    const Plan* plan = nullptr;
  };
  PlanMemo memo_;
  struct CheckMemo {
    bool valid = false;
    DataType dtype = DataType::kFloat32;
    size_t count = 0;
    Call call;  // what checked_afresh made of it (its buffer replaced per call)
  };
  CheckMemo check_memo_;
  Schedule agreement_schedule_;  // agree_on_call's rounds (built once: they depend on rank and world only)
  FlatShape agreement_flat_;     // their shape (Executor::flat_shape), worked out with them
  BufRef agreement_result_;      // where in the state they leave the agreed words
  uint64_t agreement_state_[4] = {};
  std::vector<char> scratch_;   // the families' scratch (one-shot all_reduce inputs, ...)
  std::vector<uint64_t> addrs_;  // pull schedules: published buffer addresses (buffer kAddrs)
  std::vector<int> ring_order_;  // position -> rank (identity by default)
  int ring_pos_ = 0;
  bool ring_identity_ = true;
  bool pull_ok_ = false;
  Topology topo_;
  CostModel model_;
  AutoTuner tuner_;

  std::mutex mu_;
  std::condition_variable cv_;
  CallQueue<Item> queue_;
  bool running_ = false;  // a call is executing (inline or on the worker)
  // ... which one: a literal, the name of the call run inline (alive while
  // it runs), or running_p2p_name_ (a queued send/recv's, copied); with
  // running_seq_, a queued call's number (0: none). Guarded by mu_ like running_.
  const char* running_name_ = "";
  char running_p2p_name_[64] = {};
  uint64_t running_seq_ = 0;
  std::string running_text() const;  // "all_reduce (seq 4)"
  std::thread::id issuer_;    // the thread that issued the latest call
  bool stop_ = false;
  bool closing_ = false;
  bool worker_done_ = false;  // the worker left its loop (close)
  // The hand-off rule (communicator_queue.cpp): the worker sleeps in timed
  // waits (`worker_ticking_`) until `linger_until_`, so that a small async
  // call queued meanwhile needs no wake-up.
  bool worker_ticking_ = false;
  Clock::time_point linger_until_{};
  std::atomic<bool> closed_{false};
  std::condition_variable closed_cv_;
  std::atomic<int> inside_{0};                                                // threads in calls
  std::shared_ptr<std::atomic<int>> waiters_ = std::make_shared<std::atomic<int>>(0);  // threads in Work.wait
  std::mutex life_mu_;       // transports: announce (abort) vs. release (close)
  bool released_ = false;    // guarded by life_mu_
  std::thread worker_;
  std::string error_;
  uint64_t seq_ = 0;
  std::vector<uint64_t> send_seq_, recv_seq_;  // messages sent to / recv calls naming each peer
  uint64_t any_recv_seq_ = 0;                  // recv calls from any source
  P2pMatcher matcher_;                         // (the thread running calls) send/recv matching
  std::vector<P2pMember> p2p_group_;           // the running send/recv group (reused)
};

}  // namespace ringcomm
