// Compile-time check of ringcomm's NCCL declarations (nccl_api.h) against the
// real nccl.h, where the build found one (RINGCOMM_HAVE_NCCL_H).
#ifdef RINGCOMM_HAVE_NCCL_H
#include <nccl.h>

#include <type_traits>

#include "transport/nccl/nccl_api.h"

namespace ringcomm::nccl {

static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId), "ncclUniqueId size");
static_assert(static_cast<int>(ncclSuccess) == kSuccess && static_cast<int>(ncclInProgress) == kInProgress &&
                  static_cast<int>(ncclRemoteError) == kRemoteError &&
                  static_cast<int>(ncclInvalidUsage) == kInvalidUsage,
              "ncclResult_t values");
static_assert(static_cast<int>(ncclSum) == kSum && static_cast<int>(ncclProd) == kProd &&
                  static_cast<int>(ncclMax) == kMax && static_cast<int>(ncclMin) == kMin &&
                  static_cast<int>(ncclAvg) == kAvg,
              "ncclRedOp_t values");
static_assert(static_cast<int>(ncclInt8) == kInt8 && static_cast<int>(ncclUint8) == kUint8 &&
                  static_cast<int>(ncclInt32) == kInt32 && static_cast<int>(ncclUint32) == kUint32 &&
                  static_cast<int>(ncclInt64) == kInt64 && static_cast<int>(ncclUint64) == kUint64 &&
                  static_cast<int>(ncclFloat16) == kFloat16 && static_cast<int>(ncclFloat32) == kFloat32 &&
                  static_cast<int>(ncclFloat64) == kFloat64 && static_cast<int>(ncclBfloat16) == kBfloat16,
              "ncclDataType_t values");
// The prototypes: Api's, written with NCCL's own type names (Result ->
// ncclResult_t, DataType -> ncclDataType_t, RedOp -> ncclRedOp_t, UniqueId ->
// ncclUniqueId, CommHandle -> ncclComm_t).
#define RINGCOMM_SAME(fn, ...) static_assert(std::is_same_v<decltype(&fn), __VA_ARGS__>, #fn)
RINGCOMM_SAME(ncclGetVersion, ncclResult_t (*)(int*));
RINGCOMM_SAME(ncclGetUniqueId, ncclResult_t (*)(ncclUniqueId*));
RINGCOMM_SAME(ncclCommInitRank, ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int));
RINGCOMM_SAME(ncclCommDestroy, ncclResult_t (*)(ncclComm_t));
RINGCOMM_SAME(ncclCommAbort, ncclResult_t (*)(ncclComm_t));
RINGCOMM_SAME(ncclCommGetAsyncError, ncclResult_t (*)(ncclComm_t, ncclResult_t*));
RINGCOMM_SAME(ncclGetErrorString, const char* (*)(ncclResult_t));
RINGCOMM_SAME(ncclGetLastError, const char* (*)(ncclComm_t));
RINGCOMM_SAME(ncclAllReduce, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                              cudaStream_t));
RINGCOMM_SAME(ncclBroadcast, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                                              cudaStream_t));
RINGCOMM_SAME(ncclReduce, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                                           cudaStream_t));
RINGCOMM_SAME(ncclAllGather, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
RINGCOMM_SAME(ncclReduceScatter, ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                                  ncclComm_t, cudaStream_t));
RINGCOMM_SAME(ncclSend, ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
RINGCOMM_SAME(ncclRecv, ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
RINGCOMM_SAME(ncclGroupStart, ncclResult_t (*)());
RINGCOMM_SAME(ncclGroupEnd, ncclResult_t (*)());
#undef RINGCOMM_SAME

}  // namespace ringcomm::nccl
#endif
