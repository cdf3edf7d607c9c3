// One NCCL communicator: this rank's end of the NCCL transport on one device.
// The unique id comes through the store (the Python bootstrap exchanges it).
#pragma once

#include <string>

#include "transport/nccl/nccl_api.h"

namespace ringcomm {

class NcclComm {
 public:
  // Must run with `device` current; blocks until every rank called it.
  NcclComm(int rank, int world, const std::string& unique_id);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  static std::string new_unique_id();

  nccl::CommHandle handle() const { return comm_; }
  int rank() const { return rank_; }
  int world() const { return world_; }

  // Non-empty when NCCL reported an asynchronous error (a peer died, a
  // network failure): NCCL's error string and last error message.
  std::string async_error();
  // ncclCommAbort: in-flight operations are dropped, the handle is gone.
  void abort();
  // ncclCommDestroy (after the queued work); nothing after abort().
  void destroy();

  // Throws with NCCL's message (and last error) unless r is success.
  void check(nccl::Result r, const char* what) const { nccl::check(r, what, comm_); }

 private:
  int rank_;
  int world_;
  nccl::CommHandle comm_ = nullptr;
};

}  // namespace ringcomm
