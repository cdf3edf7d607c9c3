// IpcMemory over POSIX shared memory between processes of one host: the CPU
// stand-in of the cuda_ipc transport. Buffers are /dev/shm segments (0600,
// unguessable names of the shm transport's form, unlinked once every peer
// mapped them); operations run at once on the calling thread; waits spin
// briefly, then yield, then sleep, and check the deadline, the abort word
// and whether the awaited peer's process still lives.
#pragma once

#include <string>
#include <vector>

#include "transport/cuda_ipc/ipc_memory.h"

namespace ringcomm {

class HostIpcMemory : public IpcMemory {
 public:
  HostIpcMemory() = default;
  ~HostIpcMemory() override;

  char* allocate(size_t bytes) override;
  std::string export_handle() override { return name_; }
  char* open_peer(int peer, const std::string& handle, size_t bytes) override;
  void exported() override;
  void release() override;
  char* alloc_scratch(size_t nbytes) override { return new char[nbytes]; }
  void free_scratch(char* p) override { delete[] p; }

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
  uint64_t failure() override { return 0; }

  // The segment's name while it is still in /dev/shm ("" once unlinked).
  std::string linked_name() const { return unlinked_ ? "" : name_; }

 private:
  struct Mapping {
    char* base;
    size_t bytes;
  };
  std::string name_;
  bool unlinked_ = true;
  Mapping own_{nullptr, 0};
  std::vector<Mapping> peers_;
};

}  // namespace ringcomm
