#include "comm/cuda/gpu_communicator.h"

#include <algorithm>
#include <exception>

#include "algo/schedules.h"
#include "comm/call_check.h"
#include "common/cuda/cuda_util.h"
#include "reduce/cuda/kernels.h"

namespace ringcomm {
namespace {

// NCCL's type for a dtype, or -1 when NCCL has none (bool).
int nccl_dtype(DataType t) {
  switch (t) {
    case DataType::kFloat16: return nccl::kFloat16;
    case DataType::kBFloat16: return nccl::kBfloat16;
    case DataType::kFloat32: return nccl::kFloat32;
    case DataType::kFloat64: return nccl::kFloat64;
    case DataType::kInt8: return nccl::kInt8;
    case DataType::kUInt8: return nccl::kUint8;
    case DataType::kInt32: return nccl::kInt32;
    case DataType::kInt64: return nccl::kInt64;
    case DataType::kBool: return -1;
  }
  return -1;
}

// NCCL's op (AVG: SUM, divided by ringcomm's kernel), or -1 when NCCL has none.
int nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: return nccl::kSum;
    case ReduceOp::kProd: return nccl::kProd;
    case ReduceOp::kMin: return nccl::kMin;
    case ReduceOp::kMax: return nccl::kMax;
    default: return -1;
  }
}

}  // namespace

GpuCommunicator::GpuCommunicator(int rank, int world, int device, const std::string& nccl_unique_id,
                                 double timeout_s, size_t chunk_bytes, Algo default_algo)
    : rank_(rank),
      world_(world),
      device_(device),
      timeout_s_(timeout_s),
      default_algo_(default_algo) {
  cuda::DeviceGuard g(device_);
  try {
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda::check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    executor_ = std::make_unique<DeviceExecutor>(chunk_bytes);  // checks the chunk size
    graph_executor_ = std::make_unique<DeviceExecutor>(chunk_bytes);
    nccl_ = std::make_unique<NcclComm>(rank, world, nccl_unique_id);
    ops_ = std::make_unique<NcclDeviceOps>(nccl_.get());
    executor_->allocate(*ops_);
    graph_executor_->allocate(*ops_);
  } catch (...) {
    executor_.reset();
    graph_executor_.reset();
    ops_.reset();
    nccl_.reset();
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    throw;
  }
  schedule_.reserve(256);
}

GpuCommunicator::GpuCommunicator(int rank, int world, int device, double timeout_s, IpcGeometry geometry,
                                 IpcThresholds thresholds, Algo ipc_algo)
    : rank_(rank), world_(world), device_(device), timeout_s_(timeout_s), default_algo_(ipc_algo) {
  cuda::DeviceGuard g(device_);
  try {
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda::check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    auto mem = std::make_unique<CudaIpcMemory>(device_);
    ipc_mem_ = mem.get();
    ipc_mem_->set_stream(stream_);
    auto ch = std::make_unique<IpcChannel>(rank, world, geometry, timeout_s, std::move(mem));
    ipc_ = std::make_unique<IpcCollectives>(std::move(ch), thresholds);
    ipc_->allocate();
  } catch (...) {
    ipc_.reset();
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    throw;
  }
}

GpuCommunicator::~GpuCommunicator() {
  try {
    close();
  } catch (...) {
  }
  ipc_.reset();
}

std::string GpuCommunicator::async_error() {
  if (faults_.failed()) return faults_.message();
  if (ipc_) {
    // What a wait kernel recorded (its timeout, or a peer's abort word it
    // found) in mapped host memory: free to read, so every call checks it.
    return ipc_mem_->failure() ? ipc_->channel().failure() : "";
  }
  // ncclCommGetAsyncError is safe next to a call in flight on another thread;
  // the gate keeps an abort or close() from freeing the handle meanwhile.
  if (!gate_.enter()) return faults_.message();
  const std::string e = nccl_->async_error();
  gate_.leave();  // may run an abort that waited for us
  return e;
}

void GpuCommunicator::fail(const std::string& why, bool timeout) {
  {
    std::lock_guard<std::mutex> lk(wd_mu_);
    if (!faults_.set(why, timeout, finished_locked())) return;  // failed already: the abort is under way
    release_watched_locked();
  }
  if (ipc_) {
    // Every rank's abort word: waits spinning here and on the peers give up.
    try {
      ipc_->channel().abort(why, timeout ? IpcAbortKind::kTimeout : IpcAbortKind::kError);
    } catch (const Error&) {
    }
    gate_.abort([] {});
    return;
  }
  // Now, or by the call queuing on the handle when it leaves the gate (it then
  // holds mu_ with this device current; an abort never waits for it).
  gate_.abort([this] {
    try {
      cuda::DeviceGuard g(device_);
      nccl_->abort();
      return;
    } catch (const Error&) {
    }
    nccl_->abort();  // ncclCommAbort makes its own device current
  });
}

// The highest sequence number whose event completed: the front of watched_
// is popped while done (calls finish in the order they were queued).
uint64_t GpuCommunicator::finished_locked() {
  try {
    cuda::DeviceGuard g(device_);
    while (!watched_.empty() && cuda::event_done(watched_.front().done, "cudaEventQuery (watchdog)")) {
      finished_ = watched_.front().seq;
      cudaEventDestroy(watched_.front().done);
      watched_.pop_front();
    }
  } catch (const Error&) {
    // The GPU cannot answer (a sticky error): what is still watched failed.
  }
  return finished_;
}

void GpuCommunicator::close() {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return;
  closed_ = true;
  cuda::DeviceGuard g(device_);
  {
    // The watchdog still runs here: a call that hangs past the timeout is
    // aborted, its kernels exit and this returns; after an error NCCL was
    // aborted already (fail), so the kernels exit too. Relaxed: a capture in
    // another thread is not broken by this wait.
    cuda::RelaxedCaptureMode relaxed;
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(std::string("cudaStreamSynchronize (close): ") + cudaGetErrorString(e), false);
    }
  }
  // The stream is drained: ncclCommDestroy waits for no peer. Nothing else
  // can use or abort the handle from here on.
  std::exception_ptr destroy_error;
  gate_.retire([&] {
    if (!nccl_) return;
    try {
      nccl_->destroy();
    } catch (...) {
      destroy_error = std::current_exception();
    }
  });
  stop_watchdog();  // last: it bounded every wait above
  executor_.reset();  // frees its scratch with this device current
  graph_executor_.reset();
  if (ipc_) ipc_->channel().release();  // the stream is drained: no kernel reads the buffers
  ops_.reset();
  nccl_.reset();  // nothing left to release: destroyed or aborted
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
  ready_ = nullptr;
  stream_ = nullptr;
  if (destroy_error) std::rethrow_exception(destroy_error);
}

// Called by launch() with the comm stream's work queued and device_ current.
void GpuCommunicator::watch(const char* what, uint64_t seq) {
  cudaEvent_t ev = nullptr;
  cuda::check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate (watchdog)");
  if (cudaEventRecord(ev, stream_) != cudaSuccess) {
    cudaEventDestroy(ev);
    cuda::check(cudaGetLastError(), "cudaEventRecord (watchdog)");
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s_));
  std::lock_guard<std::mutex> lk(wd_mu_);
  watched_.push_back({ev, deadline, what, seq});
  if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watchdog_loop(); });
}

void GpuCommunicator::release_watched_locked() {
  for (Watched& w : watched_) cudaEventDestroy(w.done);
  watched_.clear();
}

void GpuCommunicator::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lk(wd_mu_);
    wd_stop_ = true;
  }
  wd_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  std::lock_guard<std::mutex> lk(wd_mu_);
  release_watched_locked();
}

void GpuCommunicator::watchdog_loop() {
  if (cudaSetDevice(device_) != cudaSuccess) return;
  // For the thread's life: its event queries must not invalidate a
  // global-mode graph capture running in another thread (after cudaSetDevice:
  // the exchange initialises the current device).
  cuda::RelaxedCaptureMode relaxed;
  std::unique_lock<std::mutex> lk(wd_mu_);
  while (!wd_stop_) {
    wd_cv_.wait_for(lk, std::chrono::milliseconds(50));
    if (wd_stop_) break;
    std::string why;
    bool timeout = false;
    const auto now = std::chrono::steady_clock::now();
    while (!watched_.empty()) {
      Watched& w = watched_.front();
      const cudaError_t e = cudaEventQuery(w.done);
      if (e == cudaSuccess) {
        finished_ = w.seq;
        cudaEventDestroy(w.done);
        watched_.pop_front();
        continue;
      }
      (void)cudaGetLastError();  // "not ready" (or worse) is recorded as this thread's last error
      if (cuda::capture_error(e)) {
        // A capture elsewhere keeps the event from answering: nothing is
        // known, so no deadline applies either (it would be a false timeout).
      } else if (e != cudaErrorNotReady) {
        why = w.what + ": " + cudaGetErrorString(e);
      } else if (now > w.deadline) {
        why = w.what + " on rank " + std::to_string(rank_) + " did not finish within " + seconds_text(timeout_s_) +
              " s on the GPU (watchdog; did every rank call it?)";
        timeout = true;
      }
      break;  // calls finish in order: the oldest unfinished one decides
    }
    if (why.empty() && !watched_.empty()) {
      const std::string e = async_error();
      if (!e.empty() && !faults_.failed()) why = (ipc_ ? "cuda_ipc: " : "NCCL: ") + e;
    }
    if (!why.empty()) {
      lk.unlock();
      fail(why, timeout);
      lk.lock();
    }
  }
}

void GpuCommunicator::check_open() {
  if (closed_) throw Error("ringcomm: the GPU communicator is closed");
  const std::string earlier = faults_.message();
  if (!earlier.empty()) {
    throw Error("ringcomm: the GPU communicator is unusable after an earlier error (" + earlier + ")");
  }
  const std::string e = async_error();
  if (!e.empty()) {
    const char* who = ipc_ ? "cuda_ipc" : "NCCL";
    fail(std::string(who) + ": " + e, false);
    throw Error(std::string("ringcomm: ") + who + " reported an error: " + e);
  }
}

ChoiceContext GpuCommunicator::choice_context() const {
  ChoiceContext ctx;
  ctx.device = ipc_ ? Device::kIpc : Device::kNccl;
  ctx.configured = default_algo_;
  if (ipc_) {
    ctx.ipc = ipc_->thresholds();
    ctx.ipc_stage_bytes = ipc_->channel().geometry().stage_bytes;
  }
  return ctx;
}

namespace {

ChoiceCall choice_call(OpKind kind, Algo algo, DataType dtype, ReduceOp op, size_t bytes) {
  ChoiceCall call;
  call.kind = kind;
  call.bytes = bytes;
  call.dtype = dtype;
  call.op = op;
  call.reduces = op_reduces(kind);
  call.requested = algo;
  return call;
}

}  // namespace

Algo GpuCommunicator::choose(OpKind kind, Algo algo, DataType dtype, ReduceOp op, size_t bytes) const {
  return ringcomm::choose(choice_context(), choice_call(kind, algo, dtype, op, bytes));
}

std::vector<Candidate> GpuCommunicator::explain(OpKind kind, Algo algo, DataType dtype, ReduceOp op,
                                                size_t bytes) const {
  return candidates(choice_context(), choice_call(kind, algo, dtype, op, bytes));
}

template <class Body>
GpuCommunicator::WorkPtr GpuCommunicator::launch(const char* what, cudaStream_t caller, Body&& body) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  cuda::DeviceGuard g(device_);
  // Errors before anything is queued (a caller stream of another device, say)
  // leave the communicator usable; after that, the peers may be waiting on
  // operations this rank queued only in part, so it fails (and NCCL is
  // aborted: nothing would complete those operations).
  const bool captured = cuda::capturing(caller);
  if (captured && ipc_) {
    throw Error(std::string("ringcomm: ") + what + " over cuda_ipc cannot be captured into a CUDA graph: its "
                "flags carry sequence numbers counted on the host, which a replay would repeat (buffers are "
                "registered once, at init; use transport=nccl for graphs)");
  }
  cudaEvent_t done = nullptr;
  if (!captured) {
    cuda::check(cudaEventRecord(ready_, caller), "cudaEventRecord (caller stream)");
    cuda::check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  }
  // The handle stays valid until `inside` leaves the gate: an abort from
  // another thread meanwhile runs then, on this thread.
  if (!gate_.enter()) {
    if (done) cudaEventDestroy(done);
    throw Error("ringcomm: the GPU communicator is unusable after an earlier error (" + faults_.message() + ")");
  }
  struct Inside {
    AbortGate& gate;
    ~Inside() { gate.leave(); }
  } inside{gate_};
  const uint64_t seq = captured ? 0 : ++queued_;
  current_seq_ = seq;
  auto work = std::make_shared<GpuWork>(shared_from_this(), device_, done, captured, seq, what);
  try {
    if (captured) {
      // Inside a CUDA graph: queue on the capturing stream itself.
      body(caller);
      return work;
    }
    cuda::check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    body(stream_);
    cuda::check(cudaEventRecord(done, stream_), "cudaEventRecord (comm stream)");
    watch(what, seq);
    return work;
  } catch (const Error& e) {
    fail(e.what(), false);
    throw;
  }
}

// The "ring" family: the call's schedule (comm/call_plan.cpp plan_call), run by the
// device executor on stream `s`. Slices of the ring are one chunk each.
void GpuCommunicator::run_ring(const char* what, cudaStream_t s, DataType dtype, ReduceOp op,
                               const AddressedCall& call) {
  if (ipc_) {
    ipc_mem_->set_stream(s);
    ipc_->run(what, current_seq_, call, dtype, op);
    return;
  }
  const size_t elem = dtype_size(dtype);
  schedule_.clear();
  PlanContext ctx{rank_, world_, elem, std::max<size_t>(1, executor_->chunk_bytes() / elem), &schedule_};
  plan_call(ctx, plan_of(call, elem, world_));
  ops_->set_stream(s);
  // Calls captured into a CUDA graph (queued on the capturing stream, not on
  // stream_) get scratch of their own: a replay may run beside eager calls.
  (s == stream_ ? executor_ : graph_executor_)->run(schedule_, buffers_of(call), *ops_, dtype, op);
}

void GpuCommunicator::run_p2p(const char* what, cudaStream_t s, const std::vector<IpcP2p>& ops) {
  ipc_mem_->set_stream(s);
  ipc_->p2p(what, current_seq_, ops);
}

GpuCommunicator::WorkPtr GpuCommunicator::all_reduce(Buffer x, ReduceOp op, cudaStream_t caller, Algo algo) {
  check_call(describe_call(OpKind::kAllReduce, rank_, world_, x, Buffer{}, -1, op));
  // ValueError (NCCL forced on a NaN-dropping op, a size past the IPC stage) before anything is queued.
  const Algo fam = choose(OpKind::kAllReduce, algo, x.dtype, op, x.nbytes());
  return launch("all_reduce", caller, [&](cudaStream_t s) {
    if (x.count == 0) return;
    if (ipc_) {
      ipc_mem_->set_stream(s);
      ipc_->all_reduce(current_seq_, x.ptr, x.count, x.dtype, op, fam);
    } else if (fam == Algo::kNccl) {
      nccl_->check(nccl::api().AllReduce(x.ptr, x.ptr, x.count, nccl::DataType(nccl_dtype(x.dtype)),
                                         nccl::RedOp(nccl_op(op)), nccl_->handle(), s),
                   "ncclAllReduce");
      if (op == ReduceOp::kAvg) cuda::divide(x.dtype, x.ptr, x.count, world_, s);
    } else {
      run_ring("all_reduce", s, x.dtype, op, {OpKind::kAllReduce, x.ptr, nullptr, x.count, -1, op == ReduceOp::kAvg});
    }
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::reduce_scatter(Buffer out, Buffer in, ReduceOp op, cudaStream_t caller,
                                                         Algo algo) {
  check_call(describe_call(OpKind::kReduceScatter, rank_, world_, out, in, -1, op));
  const Algo fam = choose(OpKind::kReduceScatter, algo, in.dtype, op, in.nbytes());
  return launch("reduce_scatter", caller, [&](cudaStream_t s) {
    if (out.count == 0) return;
    if (fam == Algo::kNccl) {
      nccl_->check(nccl::api().ReduceScatter(in.ptr, out.ptr, out.count, nccl::DataType(nccl_dtype(in.dtype)),
                                             nccl::RedOp(nccl_op(op)), nccl_->handle(), s),
                   "ncclReduceScatter");
      if (op == ReduceOp::kAvg) cuda::divide(out.dtype, out.ptr, out.count, world_, s);
    } else {
      run_ring("reduce_scatter", s, in.dtype, op, {OpKind::kReduceScatter, out.ptr, in.ptr, out.count, -1, op == ReduceOp::kAvg});
    }
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::all_gather(Buffer out, Buffer in, cudaStream_t caller, Algo algo) {
  check_call(describe_call(OpKind::kAllGather, rank_, world_, out, in, -1, ReduceOp::kSum));
  const Algo fam = choose(OpKind::kAllGather, algo, in.dtype, ReduceOp::kSum, out.nbytes());
  return launch("all_gather", caller, [&](cudaStream_t s) {
    if (in.count == 0) return;
    if (fam == Algo::kNccl) {
      nccl_->check(nccl::api().AllGather(in.ptr, out.ptr, in.nbytes(), nccl::kUint8, nccl_->handle(), s),
                   "ncclAllGather");
    } else {
      run_ring("all_gather", s, in.dtype, ReduceOp::kSum, {OpKind::kAllGather, out.ptr, in.ptr, in.count, -1, false});
    }
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::broadcast(Buffer x, int root, cudaStream_t caller, Algo algo) {
  check_call(describe_call(OpKind::kBroadcast, rank_, world_, x, Buffer{}, root, ReduceOp::kSum));
  const Algo fam = choose(OpKind::kBroadcast, algo, x.dtype, ReduceOp::kSum, x.nbytes());
  return launch("broadcast", caller, [&](cudaStream_t s) {
    if (x.count == 0) return;
    if (fam == Algo::kNccl) {
      nccl_->check(nccl::api().Broadcast(x.ptr, x.ptr, x.nbytes(), nccl::kUint8, root, nccl_->handle(), s),
                   "ncclBroadcast");
    } else {
      run_ring("broadcast", s, x.dtype, ReduceOp::kSum, {OpKind::kBroadcast, x.ptr, nullptr, x.count, root, false});
    }
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::reduce(Buffer x, int root, ReduceOp op, cudaStream_t caller,
                                                 Algo algo) {
  check_call(describe_call(OpKind::kReduce, rank_, world_, x, Buffer{}, root, op));
  const Algo fam = choose(OpKind::kReduce, algo, x.dtype, op, x.nbytes());
  return launch("reduce", caller, [&](cudaStream_t s) {
    if (x.count == 0) return;
    if (fam == Algo::kNccl) {
      nccl_->check(nccl::api().Reduce(x.ptr, x.ptr, x.count, nccl::DataType(nccl_dtype(x.dtype)),
                                      nccl::RedOp(nccl_op(op)), root, nccl_->handle(), s),
                   "ncclReduce");
      if (op == ReduceOp::kAvg && rank_ == root) cuda::divide(x.dtype, x.ptr, x.count, world_, s);
    } else {
      run_ring("reduce", s, x.dtype, op, {OpKind::kReduce, x.ptr, nullptr, x.count, root, op == ReduceOp::kAvg});
    }
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::scatter(Buffer out, Buffer in, int root, cudaStream_t caller) {
  check_call(describe_call(OpKind::kScatter, rank_, world_, out, in, root, ReduceOp::kSum));
  return launch("scatter", caller, [&](cudaStream_t s) {
    run_ring("scatter", s, out.dtype, ReduceOp::kSum, {OpKind::kScatter, out.ptr, in.ptr, out.count, root, false});
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::gather(Buffer out, Buffer in, int root, cudaStream_t caller) {
  check_call(describe_call(OpKind::kGather, rank_, world_, out, in, root, ReduceOp::kSum));
  return launch("gather", caller, [&](cudaStream_t s) {
    run_ring("gather", s, in.dtype, ReduceOp::kSum, {OpKind::kGather, out.ptr, in.ptr, in.count, root, false});
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::all_to_all(Buffer out, Buffer in, cudaStream_t caller) {
  check_call(describe_call(OpKind::kAllToAll, rank_, world_, out, in, -1, ReduceOp::kSum));
  return launch("all_to_all", caller, [&](cudaStream_t s) {
    run_ring("all_to_all", s, in.dtype, ReduceOp::kSum, {OpKind::kAllToAll, out.ptr, in.ptr, in.count, -1, false});
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::send(Buffer x, int peer, cudaStream_t caller) {
  check_call(describe_p2p(true, rank_, world_, x, peer));
  return launch("send", caller, [&](cudaStream_t s) {
    if (ipc_) return run_p2p("send", s, {{true, x.ptr, x.nbytes(), peer}});
    nccl_->check(nccl::api().Send(x.ptr, x.nbytes(), nccl::kUint8, peer, nccl_->handle(), s), "ncclSend");
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::recv(Buffer x, int peer, cudaStream_t caller) {
  check_call(describe_p2p(false, rank_, world_, x, peer));
  return launch("recv", caller, [&](cudaStream_t s) {
    if (ipc_) return run_p2p("recv", s, {{false, x.ptr, x.nbytes(), peer}});
    nccl_->check(nccl::api().Recv(x.ptr, x.nbytes(), nccl::kUint8, peer, nccl_->handle(), s), "ncclRecv");
  });
}

GpuCommunicator::WorkPtr GpuCommunicator::sendrecv(Buffer send_buf, int dst, Buffer recv_buf, int src,
                                                   cudaStream_t caller) {
  check_call(describe_p2p(true, rank_, world_, send_buf, dst));
  check_call(describe_p2p(false, rank_, world_, recv_buf, src));
  return launch("sendrecv", caller, [&](cudaStream_t s) {
    if (ipc_) return run_p2p("sendrecv", s, {{true, send_buf.ptr, send_buf.nbytes(), dst},
                                             {false, recv_buf.ptr, recv_buf.nbytes(), src}});
    const nccl::Api& a = nccl::api();
    nccl_->check(a.GroupStart(), "ncclGroupStart");
    nccl::Result r = a.Send(send_buf.ptr, send_buf.nbytes(), nccl::kUint8, dst, nccl_->handle(), s);
    if (r == nccl::kSuccess) r = a.Recv(recv_buf.ptr, recv_buf.nbytes(), nccl::kUint8, src, nccl_->handle(), s);
    nccl::Result end = a.GroupEnd();
    nccl_->check(r, "ncclSend/ncclRecv");
    nccl_->check(end, "ncclGroupEnd");
  });
}

}  // namespace ringcomm
