// IpcMemory on CUDA GPUs of one host: the communication buffer is cudaMalloc'd
// and exported with cudaIpcGetMemHandle; peers map it with
// cudaIpcOpenMemHandle (ranks on other GPUs of the host: peer access enabled
// where cudaDeviceCanAccessPeer allows, else the driver stages copies; ranks
// on the same GPU: the same device memory, which NCCL cannot serve).
// Operations are queued on the stream set by set_stream(); waits are kernels
// with a bounded spin (ipc_kernels.cu) that record a failure in mapped host
// memory instead of spinning forever; abort words are set from the host by a
// kernel on a stream of their own, so they reach a wait that is spinning.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "transport/cuda_ipc/cuda/ipc_kernels.h"
#include "transport/cuda_ipc/ipc_memory.h"

namespace ringcomm {

class CudaIpcMemory : public IpcMemory {
 public:
  explicit CudaIpcMemory(int device);
  ~CudaIpcMemory() override;

  void set_stream(cudaStream_t s) { stream_ = s; }
  int device() const { return device_; }

  char* allocate(size_t bytes) override;
  std::string export_handle() override;
  char* open_peer(int peer, const std::string& handle, size_t bytes) override;
  void exported() override {}  // IPC handles leave nothing behind when a process dies
  void release() override;
  char* alloc_scratch(size_t nbytes) override;
  void free_scratch(char* p) override;

  void copy(char* dst, const char* src, size_t nbytes) override;
  void reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) override;
  void divide(DataType dtype, char* buf, size_t count, int divisor) override;
  void transfers(const std::vector<IpcTransfer>& ts, const IpcBounds& b) override;
  void wait_all(const std::vector<IpcWait>& ws, const IpcBounds& b) override;
  void post_all(const std::vector<IpcPost>& ps) override;

  void set_words(const std::vector<uint64_t*>& words, uint64_t value) override;
  uint64_t read_word(const uint64_t* word) override;
  void read_bytes(void* dst, const void* src, size_t n) override;
  void write_bytes(void* dst, const void* src, size_t n) override;
  uint64_t failure() override;

 private:
  cuda::IpcKernelBounds kernel_bounds(const IpcBounds& b) const;

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;  // abort words and host reads: never behind a spinning wait
  char* own_ = nullptr;
  std::vector<char*> peers_;
  unsigned long long* status_host_ = nullptr;  // mapped: failures recorded by kernels
  unsigned long long* status_dev_ = nullptr;
  cuda::IpcKernelTransfer* table_ = nullptr;  // transfers of the current launch (device)
  size_t table_cap_ = 0;                      // entries (heads follow the transfers)
  bool released_ = false;
};

}  // namespace ringcomm
