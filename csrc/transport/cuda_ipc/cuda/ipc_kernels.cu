// Kernels of the cuda_ipc transport (see ipc_kernels.h and the protocol in
// transport/cuda_ipc/ipc_channel.h).
//
// Waits: thread 0 of a block spins on a flag of its own rank's buffer with
// volatile loads, checks the abort word, and reads %globaltimer every few
// hundred polls: past the deadline (or on an abort) it records the failure
// (the status word in mapped host memory, so the host's watchdog sees it
// without synchronising; every rank's abort word, compare-and-swap from 0 so
// the first failure is the one named) and the whole block returns. Later work
// of the launch and of later launches finds the abort word set and returns at
// once, so a dead peer never leaves a kernel spinning past the deadline.
// __nanosleep between polls (sm_70+) leaves issue slots to the kernels of
// other ranks that share the GPU.
//
// Posts: __threadfence_system() after the block's copies, then a volatile
// store: a peer that sees the flag sees the data.
#include "transport/cuda_ipc/cuda/ipc_kernels.h"

#include <cuda_runtime.h>

#include <string>

#include "ringcomm/types.h"

namespace ringcomm::cuda {

namespace {

constexpr int kThreads = 512;

struct PtrArgs {
  const uint64_t* flags[kIpcMaxRanks * 4];
  uint64_t at_least[kIpcMaxRanks * 4];
  const uint64_t* checks[kIpcMaxRanks * 4];
  uint64_t check_values[kIpcMaxRanks * 4];
  int32_t peers[kIpcMaxRanks * 4];
};
struct PostArgs {
  uint64_t* flags[kIpcMaxRanks * 4];
  uint64_t values[kIpcMaxRanks * 4];
};
struct WordArgs {
  uint64_t* words[kIpcMaxRanks];
};

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t load_volatile(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}

// The same encoding as ipc_abort_word (transport/cuda_ipc/ipc_memory.h).
__device__ __forceinline__ uint64_t abort_word(uint64_t kind, int rank, int peer) {
  return kind | (static_cast<uint64_t>(rank + 1) & 0xffffff) << 8 | static_cast<uint64_t>(peer + 1) << 32;
}

__device__ void fail(const IpcKernelBounds& b, uint64_t word) {
  for (int i = 0; i < b.ntargets; ++i) {
    atomicCAS_system(reinterpret_cast<unsigned long long*>(b.targets[i]), 0ULL,
                     static_cast<unsigned long long>(word));
  }
  const uint64_t first = load_volatile(b.abort_word);
  atomicCAS_system(b.status, 0ULL, static_cast<unsigned long long>(first ? first : word));
  __threadfence_system();
}

// Thread 0 only. True when the flag reached `at_least`; false after a failure
// (recorded).
__device__ bool bounded_wait(const uint64_t* flag, uint64_t at_least, int peer, const IpcKernelBounds& b,
                             uint64_t deadline) {
  unsigned polls = 0;
  while (load_volatile(flag) < at_least) {
    const uint64_t aborted = load_volatile(b.abort_word);
    if (aborted) {
      atomicCAS_system(b.status, 0ULL, static_cast<unsigned long long>(aborted));
      return false;
    }
    if (++polls % 256 == 0 && global_ns() > deadline) {
      fail(b, abort_word(1 /* timeout */, b.rank, peer));
      return false;
    }
#if __CUDA_ARCH__ >= 700
    __nanosleep(64);
#endif
  }
  return true;
}

// Thread 0 only, after a wait was reached: the peer's stamp must match.
__device__ bool stamp_ok(const uint64_t* check, uint64_t value, int peer, const IpcKernelBounds& b) {
  if (!check || load_volatile(check) == value) return true;
  fail(b, abort_word(4 /* mismatch */, b.rank, peer));
  return false;
}

__device__ void block_copy(char* dst, const char* src, uint64_t n) {
  const bool vec = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  uint64_t done = 0;
  if (vec) {
    const uint64_t nv = n / 16;
    auto* d = reinterpret_cast<uint4*>(dst);
    const auto* s = reinterpret_cast<const uint4*>(src);
    for (uint64_t i = threadIdx.x; i < nv; i += blockDim.x) d[i] = s[i];
    done = nv * 16;
  }
  for (uint64_t i = done + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// One chain, by one block.
__device__ void run_chain(const IpcKernelTransfer* ts, int32_t head, const IpcKernelBounds& b) {
  __shared__ int ok;
  const uint64_t deadline = global_ns() + b.timeout_ns;
  for (int32_t i = head; i >= 0; i = ts[i].next) {
    const IpcKernelTransfer t = ts[i];
    if (threadIdx.x == 0) {
      ok = (t.at_least == 0 ? load_volatile(b.abort_word) == 0
                            : bounded_wait(t.wait, t.at_least, t.peer, b, deadline)) &&
           stamp_ok(t.check, t.check_value, t.peer, b);
    }
    __syncthreads();
    if (!ok) return;
    block_copy(t.dst, t.src, t.nbytes);
    __threadfence_system();  // every thread's data, before the barrier ...
    __syncthreads();
    if (threadIdx.x == 0) {
      if (t.stamp) *reinterpret_cast<volatile uint64_t*>(t.stamp) = t.stamp_value;
      __threadfence_system();  // ... and the stamp, before the flag
      if (t.post) *reinterpret_cast<volatile uint64_t*>(t.post) = t.value;
    }
  }
}

// The table in device memory (groups of more than kIpcSmallBatch transfers).
__global__ void transfers_kernel(const IpcKernelTransfer* ts, const int32_t* heads, IpcKernelBounds b) {
  run_chain(ts, heads[blockIdx.x], b);
}

// The common case: the transfers travel as the kernel's parameters, so
// queuing a group copies nothing from pageable host memory (which the driver
// may do synchronously with the stream, blocking the host behind a wait).
__global__ void small_transfers_kernel(IpcSmallBatch batch, IpcKernelBounds b) {
  run_chain(batch.t, batch.heads[blockIdx.x], b);
}

__global__ void wait_all_kernel(PtrArgs a, int n, IpcKernelBounds b) {
  if (threadIdx.x != 0) return;
  const uint64_t deadline = global_ns() + b.timeout_ns;
  for (int i = 0; i < n; ++i) {
    if (!bounded_wait(a.flags[i], a.at_least[i], a.peers[i], b, deadline)) return;
    if (!stamp_ok(a.checks[i], a.check_values[i], a.peers[i], b)) return;
  }
}

__global__ void post_all_kernel(PostArgs a, int n) {
  for (int i = 0; i < n; ++i) {
    __threadfence_system();
    *reinterpret_cast<volatile uint64_t*>(a.flags[i]) = a.values[i];
  }
}

__global__ void set_words_kernel(WordArgs a, int n, uint64_t value) {
  if (static_cast<int>(threadIdx.x) < n) {
    atomicCAS_system(reinterpret_cast<unsigned long long*>(a.words[threadIdx.x]), 0ULL,
                     static_cast<unsigned long long>(value));
  }
  __threadfence_system();
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("ringcomm: ") + what + " launch failed: " + cudaGetErrorString(e));
}

}  // namespace

void ipc_transfers(const IpcKernelTransfer* ts, const int32_t* heads, int nchains, const IpcKernelBounds& b,
                   cudaStream_t stream) {
  if (nchains <= 0) return;
  transfers_kernel<<<nchains, kThreads, 0, stream>>>(ts, heads, b);
  check_launch("cuda_ipc transfers kernel");
}

void ipc_small_transfers(const IpcSmallBatch& batch, int nchains, const IpcKernelBounds& b, cudaStream_t stream) {
  if (nchains <= 0) return;
  small_transfers_kernel<<<nchains, kThreads, 0, stream>>>(batch, b);
  check_launch("cuda_ipc transfers kernel");
}

void ipc_wait_all(const uint64_t* const* flags, const uint64_t* at_least, const uint64_t* const* checks,
                  const uint64_t* check_values, const int32_t* peers, int n, const IpcKernelBounds& b,
                  cudaStream_t stream) {
  if (n <= 0) return;
  if (n > kIpcMaxRanks * 4) throw ValueError("cuda_ipc: too many flags for one wait");
  PtrArgs a{};
  for (int i = 0; i < n; ++i) {
    a.flags[i] = flags[i];
    a.at_least[i] = at_least[i];
    a.checks[i] = checks[i];
    a.check_values[i] = check_values[i];
    a.peers[i] = peers[i];
  }
  wait_all_kernel<<<1, 32, 0, stream>>>(a, n, b);
  check_launch("cuda_ipc wait kernel");
}

void ipc_post_all(uint64_t* const* flags, const uint64_t* values, int n, cudaStream_t stream) {
  if (n <= 0) return;
  if (n > kIpcMaxRanks * 4) throw ValueError("cuda_ipc: too many flags for one post");
  PostArgs a{};
  for (int i = 0; i < n; ++i) {
    a.flags[i] = flags[i];
    a.values[i] = values[i];
  }
  post_all_kernel<<<1, 1, 0, stream>>>(a, n);
  check_launch("cuda_ipc post kernel");
}

void ipc_set_words(uint64_t* const* words, int n, uint64_t value, cudaStream_t stream) {
  if (n <= 0) return;
  if (n > kIpcMaxRanks) throw ValueError("cuda_ipc: too many abort words");
  WordArgs a{};
  for (int i = 0; i < n; ++i) a.words[i] = words[i];
  set_words_kernel<<<1, kIpcMaxRanks, 0, stream>>>(a, n, value);
  check_launch("cuda_ipc abort kernel");
}

}  // namespace ringcomm::cuda
