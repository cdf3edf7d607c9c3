// NCCL, loaded at run time.
//
// ringcomm never links libnccl: the library is dlopen'ed on first use (the one
// torch already loaded, the nvidia-nccl-cu12/cu13 wheel's, or the system's),
// so the module imports where NCCL is absent and works with whichever wheel
// the user installed. These are ringcomm's own declarations of the part of
// NCCL's C ABI it calls (stable since NCCL 2.10); nccl_check.cpp compares them
// with the real nccl.h wherever the build finds one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

namespace ringcomm::nccl {

enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

enum RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };

enum DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};

constexpr size_t kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};

struct Comm;  // opaque ncclComm
using CommHandle = Comm*;

// The functions ringcomm calls, resolved from the loaded library.
struct Api {
  Result (*GetVersion)(int* version);
  Result (*GetUniqueId)(UniqueId* id);
  Result (*CommInitRank)(CommHandle* comm, int nranks, UniqueId id, int rank);
  Result (*CommDestroy)(CommHandle comm);
  Result (*CommAbort)(CommHandle comm);
  Result (*CommGetAsyncError)(CommHandle comm, Result* async_error);
  const char* (*GetErrorString)(Result result);
  const char* (*GetLastError)(CommHandle comm);  // may be null (NCCL < 2.13)
  Result (*AllReduce)(const void* send, void* recv, size_t count, DataType dtype, RedOp op, CommHandle comm,
                      cudaStream_t stream);
  Result (*Broadcast)(const void* send, void* recv, size_t count, DataType dtype, int root, CommHandle comm,
                      cudaStream_t stream);
  Result (*Reduce)(const void* send, void* recv, size_t count, DataType dtype, RedOp op, int root,
                   CommHandle comm, cudaStream_t stream);
  Result (*AllGather)(const void* send, void* recv, size_t send_count, DataType dtype, CommHandle comm,
                      cudaStream_t stream);
  Result (*ReduceScatter)(const void* send, void* recv, size_t recv_count, DataType dtype, RedOp op,
                          CommHandle comm, cudaStream_t stream);
  Result (*Send)(const void* send, size_t count, DataType dtype, int peer, CommHandle comm, cudaStream_t stream);
  Result (*Recv)(void* recv, size_t count, DataType dtype, int peer, CommHandle comm, cudaStream_t stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();

  int version = 0;   // e.g. 23203 for 2.32.3
  std::string path;  // the file it was loaded from
};

// Where to look besides RINGCOMM_NCCL_LIBRARY and the loader's own search
// (the Python layer adds the nvidia-nccl wheel's lib folder). Before api().
void set_search_paths(std::vector<std::string> paths);

// The loaded library; loads it on first call. Throws ringcomm::Error naming
// every place it looked when no usable libnccl.so.2 is found.
const Api& api();

// Throws ringcomm::Error("ringcomm: <what> failed: <NCCL's error string>[: <last error>]")
// unless r is kSuccess.
void check(Result r, const char* what, CommHandle comm = nullptr);

}  // namespace ringcomm::nccl
