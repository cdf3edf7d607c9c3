#include "transport/nccl/nccl_comm.h"

#include <cstring>

#include "ringcomm/types.h"

namespace ringcomm {

std::string NcclComm::new_unique_id() {
  nccl::UniqueId id;
  nccl::check(nccl::api().GetUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof id.internal);
}

NcclComm::NcclComm(int rank, int world, const std::string& unique_id) : rank_(rank), world_(world) {
  if (unique_id.size() != nccl::kUniqueIdBytes) {
    throw ValueError("ringcomm: an NCCL unique id has " + std::to_string(nccl::kUniqueIdBytes) +
                     " bytes, got " + std::to_string(unique_id.size()));
  }
  nccl::UniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  nccl::check(nccl::api().CommInitRank(&comm_, world, id, rank), "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  try {
    destroy();
  } catch (...) {
  }
}

std::string NcclComm::async_error() {
  if (!comm_) return {};
  const nccl::Api& a = nccl::api();
  nccl::Result r = nccl::kSuccess;
  if (a.CommGetAsyncError(comm_, &r) != nccl::kSuccess) return "ncclCommGetAsyncError failed";
  if (r == nccl::kSuccess || r == nccl::kInProgress) return {};
  std::string msg = a.GetErrorString(r);
  if (a.GetLastError) {
    const char* last = a.GetLastError(comm_);
    if (last && *last) msg += std::string(": ") + last;
  }
  return msg;
}

void NcclComm::abort() {
  if (!comm_) return;
  nccl::CommHandle c = comm_;
  comm_ = nullptr;
  nccl::api().CommAbort(c);
}

void NcclComm::destroy() {
  if (!comm_) return;
  nccl::CommHandle c = comm_;
  comm_ = nullptr;
  nccl::check(nccl::api().CommDestroy(c), "ncclCommDestroy");
}

}  // namespace ringcomm
