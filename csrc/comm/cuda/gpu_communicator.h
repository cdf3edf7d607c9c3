// The GPU side of a communicator on one device: an NCCL communicator, the
// communicator's own CUDA stream, and the two algorithm families.
//
// Stream semantics (docs/gpus.md): every call is ordered after the work already
// queued on the caller's stream (an event recorded there, waited on by the
// comm stream), runs on the comm stream, and returns a GpuWork whose event
// marks its end. A caller stream that is capturing a CUDA graph gets the
// operation queued on itself instead (no events), so the graph holds it; the
// ring family's captured calls use scratch of their own, so a replay may run
// beside eager calls (but two graphs holding ring calls of one communicator
// must not replay at once).
//
// Transports: NCCL (every family), or cuda_ipc (comm/ipc_collectives.h: the
// "ring" family's schedules over IPC-mapped buffers of the ranks of one host,
// and one-shot / two-shot all_reduce; several ranks may share one GPU, which
// NCCL refuses). cuda_ipc keeps its sequence numbers on the host, so its calls
// cannot be captured into CUDA graphs: a capturing caller stream is refused
// with an error before anything is queued.
//
// Families: "nccl" calls NCCL's own collective; "ring" runs ringcomm's
// schedules (csrc/algo) over NCCL send/recv with ringcomm's CUDA kernels.
// AVG is always SUM then ringcomm's divide kernel, so both families round
// alike. Which family a call runs: comm/chooser.h (bool, the bitwise ops and
// floating-point MIN/MAX go to "ring" under auto).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "algo/step.h"
#include "comm/buffer.h"
#include "comm/cuda/nccl_device_ops.h"
#include "comm/device_executor.h"
#include "comm/call_plan.h"
#include "comm/fault_state.h"
#include "comm/cuda/gpu_work.h"
#include "comm/chooser.h"
#include "comm/ipc_collectives.h"
#include "transport/cuda_ipc/cuda/cuda_ipc_memory.h"
#include "transport/nccl/nccl_comm.h"

namespace ringcomm {

class GpuCommunicator : public std::enable_shared_from_this<GpuCommunicator> {
 public:
  // Collective over all ranks (ncclCommInitRank); `device` becomes current
  // for the duration.
  GpuCommunicator(int rank, int world, int device, const std::string& nccl_unique_id, double timeout_s,
                  size_t chunk_bytes, Algo default_algo);
  // Over cuda_ipc: allocates this rank's IPC buffer; then, on every rank,
  // ipc_handle() goes through the store, ipc_connect() maps the peers', and
  // after a barrier ipc_exported() (python/ringcomm/cuda_ipc.py).
  GpuCommunicator(int rank, int world, int device, double timeout_s, IpcGeometry geometry,
                  IpcThresholds thresholds, Algo ipc_algo);
  ~GpuCommunicator();

  bool over_ipc() const { return ipc_ != nullptr; }
  std::string ipc_handle() const { return ipc_->channel().handle(); }
  void ipc_connect(const std::vector<std::string>& handles) { ipc_->channel().connect(handles); }
  void ipc_exported() { ipc_->channel().exported(); }

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  double timeout_s() const { return timeout_s_; }

  using WorkPtr = std::shared_ptr<GpuWork>;
  // `algo`: the call's algo= (kAuto: the communicator's setting), resolved
  // by the chooser (comm/chooser.h) before anything is queued.
  WorkPtr all_reduce(Buffer x, ReduceOp op, cudaStream_t caller, Algo algo);
  WorkPtr reduce_scatter(Buffer out, Buffer in, ReduceOp op, cudaStream_t caller, Algo algo);
  WorkPtr all_gather(Buffer out, Buffer in, cudaStream_t caller, Algo algo);
  WorkPtr broadcast(Buffer x, int root, cudaStream_t caller, Algo algo);
  WorkPtr reduce(Buffer x, int root, ReduceOp op, cudaStream_t caller, Algo algo);
  WorkPtr scatter(Buffer out, Buffer in, int root, cudaStream_t caller);
  WorkPtr gather(Buffer out, Buffer in, int root, cudaStream_t caller);
  WorkPtr all_to_all(Buffer out, Buffer in, cudaStream_t caller);
  WorkPtr send(Buffer x, int peer, cudaStream_t caller);
  WorkPtr recv(Buffer x, int peer, cudaStream_t caller);
  // A send and a receive in one NCCL group (they progress together: two ranks
  // exchanging never wait on each other's send).
  WorkPtr sendrecv(Buffer send_buf, int dst, Buffer recv_buf, int src, cudaStream_t caller);

  // A watchdog thread (started with the first call) looks at the calls in
  // flight every 50 ms: one past the communicator's timeout, or an NCCL
  // asynchronous error, aborts the NCCL communicator (its kernels stop
  // spinning) and makes later calls raise, as torch's NCCL watchdog does;
  // synchronous calls are never waited on by the host, so nothing else would.
  // It runs in relaxed capture mode, so its event queries never break another
  // thread's CUDA graph capture.
  //
  // Errors (comm/fault_state.h): every error poisons the communicator and
  // aborts the NCCL communicator, whoever saw it (a queuing call, the
  // watchdog, a waiter, the user), so no kernel keeps spinning and close()
  // never waits on peers; the calls queued and not seen finished before it
  // failed with it (GpuWork::error).

  // NCCL's asynchronous error, or the communicator's own error ("" if none).
  std::string async_error();
  // Records `why` (the first error wins), then aborts the NCCL communicator:
  // in-flight operations are dropped, later calls raise.
  void fail(const std::string& why, bool timeout);
  void abort(const std::string& why) { fail(why, false); }
  // The error operation `seq` failed with ("" if none).
  std::string error_of(uint64_t seq) const { return faults_.error_of(seq); }
  bool error_is_timeout() const { return faults_.timeout(); }
  // Waits for the queued work (the watchdog still bounds it), destroys the
  // NCCL communicator (or, after an error, nothing: it was aborted), stops
  // the watchdog, then frees the scratch and the stream.
  void close();
  // What a call runs under `algo` (comm/chooser.h over this communicator's
  // device and settings): kNccl or kRing over NCCL; kOneShot, kTwoShot or
  // kRing over cuda_ipc. `bytes`: call_model_bytes.
  Algo choose(OpKind kind, Algo algo, DataType dtype, ReduceOp op, size_t bytes) const;
  std::vector<Candidate> explain(OpKind kind, Algo algo, DataType dtype, ReduceOp op, size_t bytes) const;

 private:
  ChoiceContext choice_context() const;
  template <class Body>
  WorkPtr launch(const char* what, cudaStream_t caller, Body&& body);
  void check_open();
  void watch(const char* what, uint64_t seq);
  void watchdog_loop();
  void stop_watchdog();
  uint64_t finished_locked();
  void release_watched_locked();
  void run_ring(const char* what, cudaStream_t s, DataType dtype, ReduceOp op, const AddressedCall& call);
  void run_p2p(const char* what, cudaStream_t s, const std::vector<IpcP2p>& ops);

  int rank_;
  int world_;
  int device_;
  double timeout_s_;
  Algo default_algo_;  // RINGCOMM_GPU_ALGO (NCCL) or RINGCOMM_IPC_ALGO (cuda_ipc)
  std::unique_ptr<NcclComm> nccl_;  // its handle: only between gate_.enter() and leave()
  std::unique_ptr<NcclDeviceOps> ops_;         // the ring family's device operations
  std::unique_ptr<DeviceExecutor> executor_;  // released before ops_ and nccl_ (close)
  std::unique_ptr<DeviceExecutor> graph_executor_;  // the same, for calls captured into CUDA graphs
  // cuda_ipc instead of NCCL: kept until the destructor (close() releases its
  // buffers), so an abort from another thread always finds it.
  std::unique_ptr<IpcCollectives> ipc_;
  CudaIpcMemory* ipc_mem_ = nullptr;  // owned by ipc_'s channel
  uint64_t current_seq_ = 0;  // the call being queued (under mu_)
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the caller's stream before each call
  Schedule schedule_;
  // Lock order: mu_, then wd_mu_, then the gate's and faults_' own.
  std::mutex mu_;  // one call queued at a time (they share the stream and the executor)
  AbortGate gate_;     // nccl_'s handle against a concurrent abort (any thread)
  FaultRecord faults_;  // the error, and which calls it covers
  uint64_t queued_ = 0;  // calls given a sequence number (under mu_)
  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;
  std::thread watchdog_;
  struct Watched {
    cudaEvent_t done;  // the watchdog's own event (a Work's may be gone first)
    std::chrono::steady_clock::time_point deadline;
    std::string what;
    uint64_t seq;
  };
  std::deque<Watched> watched_;
  uint64_t finished_ = 0;  // the highest seq seen finished (under wd_mu_)
  bool closed_ = false;
};

}  // namespace ringcomm
