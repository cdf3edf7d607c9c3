// The cuda_ipc transport's kernels (ipc_kernels.cu): flag waits whose spin is
// bounded by a deadline and by the abort word, copies between IPC-mapped
// buffers, flag posts. Plain C++ on the outside.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ringcomm::cuda {

constexpr int kIpcMaxRanks = 16;

// One transfer (transport/cuda_ipc/ipc_memory.h IpcTransfer) as the kernel
// reads it; `next` links the transfers of one chain (same post flag: they
// must post in order), -1 ends it.
struct IpcKernelTransfer {
  const uint64_t* wait;
  uint64_t at_least;
  char* dst;
  const char* src;
  uint64_t nbytes;
  uint64_t* post;
  uint64_t value;
  const uint64_t* check;  // after the wait: *check == check_value (nullptr: none)
  uint64_t check_value;
  uint64_t* stamp;        // after the copy, before the post (nullptr: none)
  uint64_t stamp_value;
  int32_t peer;
  int32_t next;
};

// What bounds every wait of a launch.
struct IpcKernelBounds {
  const uint64_t* abort_word;             // this rank's (any rank that fails sets it)
  uint64_t* targets[kIpcMaxRanks];        // every rank's abort word, set when a wait fails
  int ntargets;
  int rank;
  uint64_t timeout_ns;                    // from the kernel's start (%globaltimer)
  unsigned long long* status;             // mapped host memory: the failure's word, for the host
};

// Up to this many transfers go as kernel parameters (4 KiB at most, with the bounds).
constexpr int kIpcSmallBatch = 24;
struct IpcSmallBatch {
  IpcKernelTransfer t[kIpcSmallBatch];
  int32_t heads[kIpcSmallBatch];
};
static_assert(sizeof(IpcSmallBatch) + sizeof(IpcKernelBounds) <= 4000, "kernel parameters stay under 4 KiB");
void ipc_small_transfers(const IpcSmallBatch& batch, int nchains, const IpcKernelBounds& b, cudaStream_t stream);

// Runs the chains starting at heads[0..nchains) (device memory, as `ts`), one
// block each, all blocks resident at once.
void ipc_transfers(const IpcKernelTransfer* ts, const int32_t* heads, int nchains, const IpcKernelBounds& b,
                   cudaStream_t stream);
// Waits until every flags[i] >= at_least[i], then checks *checks[i] ==
// check_values[i] where checks[i] is not null (n <= kIpcMaxRanks * 4).
void ipc_wait_all(const uint64_t* const* flags, const uint64_t* at_least, const uint64_t* const* checks,
                  const uint64_t* check_values, const int32_t* peers, int n, const IpcKernelBounds& b,
                  cudaStream_t stream);
// *flags[i] = values[i] in order, after everything before it on the stream
// (system fences between).
void ipc_post_all(uint64_t* const* flags, const uint64_t* values, int n, cudaStream_t stream);
// *words[i] = value where it is 0 (compare-and-swap), on `stream`.
void ipc_set_words(uint64_t* const* words, int n, uint64_t value, cudaStream_t stream);

}  // namespace ringcomm::cuda
