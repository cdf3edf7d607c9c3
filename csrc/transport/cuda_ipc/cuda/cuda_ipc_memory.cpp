#include "transport/cuda_ipc/cuda/cuda_ipc_memory.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/cuda/cuda_util.h"
#include "reduce/cuda/kernels.h"

namespace ringcomm {

namespace {

std::string to_hex(const void* p, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char b = static_cast<const unsigned char*>(p)[i];
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

bool from_hex(const std::string& s, void* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = nib(s[2 * i]), lo = nib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

}  // namespace

CudaIpcMemory::CudaIpcMemory(int device) : device_(device) {
  cuda::DeviceGuard g(device_);
  cuda::check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreate (cuda_ipc)");
  cuda::check(cudaHostAlloc(reinterpret_cast<void**>(&status_host_), sizeof(unsigned long long), cudaHostAllocMapped),
              "cudaHostAlloc (cuda_ipc status)");
  *status_host_ = 0;
  cuda::check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&status_dev_), status_host_, 0),
              "cudaHostGetDevicePointer (cuda_ipc status)");
}

CudaIpcMemory::~CudaIpcMemory() {
  try {
    release();
  } catch (...) {
  }
}

char* CudaIpcMemory::allocate(size_t bytes) {
  cuda::DeviceGuard g(device_);
  void* p = nullptr;
  cuda::check(cudaMalloc(&p, bytes), "cudaMalloc (cuda_ipc buffer)");
  own_ = static_cast<char*>(p);
  cuda::check(cudaMemsetAsync(own_, 0, bytes, side_), "cudaMemset (cuda_ipc buffer)");
  cuda::check(cudaStreamSynchronize(side_), "cudaStreamSynchronize (cuda_ipc buffer)");
  return own_;
}

// "<device>:<pci bus id>:<handle hex>": the device tells a peer whether peer
// access is needed; the handle is what cudaIpcOpenMemHandle takes.
std::string CudaIpcMemory::export_handle() {
  cudaIpcMemHandle_t h;
  cuda::DeviceGuard g(device_);
  cuda::check(cudaIpcGetMemHandle(&h, own_), "cudaIpcGetMemHandle");
  char bus[32] = {};
  cuda::check(cudaDeviceGetPCIBusId(bus, sizeof bus, device_), "cudaDeviceGetPCIBusId");
  return std::to_string(device_) + ":" + bus + ":" + to_hex(&h, sizeof h);
}

char* CudaIpcMemory::open_peer(int peer, const std::string& handle, size_t bytes) {
  const std::string who = "rank " + std::to_string(peer) + "'s cuda_ipc handle";
  const size_t a = handle.find(':'), b = handle.rfind(':');
  cudaIpcMemHandle_t h;
  if (a == std::string::npos || b == a || !from_hex(handle.substr(b + 1), &h, sizeof h)) {
    throw Error("ringcomm: " + who + " is malformed: '" + handle.substr(0, 80) + "'");
  }
  cuda::DeviceGuard g(device_);
  int peer_device = -1;
  const std::string bus = handle.substr(a + 1, b - a - 1);
  if (cudaDeviceGetByPCIBusId(&peer_device, bus.c_str()) != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("ringcomm: " + who + " names GPU " + bus + ", which this process cannot see (set the same "
                "CUDA_VISIBLE_DEVICES on every rank of the host, or none)");
  }
  if (peer_device != device_) {
    int can = 0;
    cuda::check(cudaDeviceCanAccessPeer(&can, device_, peer_device), "cudaDeviceCanAccessPeer");
    if (can) {
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer_device, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) cuda::check(e, "cudaDeviceEnablePeerAccess");
      (void)cudaGetLastError();
    }
  }
  void* p = nullptr;
  cuda::check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), ("cudaIpcOpenMemHandle (" + who + ")").c_str());
  (void)bytes;  // the allocation's size is the peer's; its header is checked by the channel
  peers_.push_back(static_cast<char*>(p));
  return peers_.back();
}

void CudaIpcMemory::release() {
  if (released_) return;
  released_ = true;
  cuda::DeviceGuard g(device_);
  // Waits past the deadline give up on their own, so these never wait on a peer
  // for longer than the deadline.
  for (char* p : peers_) cudaIpcCloseMemHandle(p);
  peers_.clear();
  if (table_) cudaFree(table_);
  table_ = nullptr;
  if (own_) cudaFree(own_);
  own_ = nullptr;
  if (side_) cudaStreamDestroy(side_);
  side_ = nullptr;
  if (status_host_) cudaFreeHost(status_host_);
  status_host_ = nullptr;
  (void)cudaGetLastError();
}

char* CudaIpcMemory::alloc_scratch(size_t nbytes) {
  cuda::DeviceGuard g(device_);
  void* p = nullptr;
  cuda::check(cudaMalloc(&p, nbytes), "cudaMalloc (cuda_ipc scratch)");
  return static_cast<char*>(p);
}

void CudaIpcMemory::free_scratch(char* p) {
  cuda::DeviceGuard g(device_);
  cudaFree(p);
}

void CudaIpcMemory::copy(char* dst, const char* src, size_t nbytes) {
  if (nbytes && dst != src) {
    cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (cuda_ipc)");
  }
}

void CudaIpcMemory::reduce(DataType dtype, ReduceOp op, char* dst, const char* a, const char* b, size_t count) {
  cuda::reduce(dtype, op, dst, a, b, count, stream_);
}

void CudaIpcMemory::divide(DataType dtype, char* buf, size_t count, int divisor) {
  cuda::divide(dtype, buf, count, divisor, stream_);
}

cuda::IpcKernelBounds CudaIpcMemory::kernel_bounds(const IpcBounds& b) const {
  cuda::IpcKernelBounds k{};
  if (b.peer_abort_words.size() > static_cast<size_t>(cuda::kIpcMaxRanks)) {
    throw ValueError("cuda_ipc: at most " + std::to_string(cuda::kIpcMaxRanks) + " ranks per host");
  }
  k.abort_word = b.abort_word;
  k.ntargets = static_cast<int>(b.peer_abort_words.size());
  for (int i = 0; i < k.ntargets; ++i) k.targets[i] = b.peer_abort_words[i];
  k.rank = b.rank;
  k.timeout_ns = static_cast<uint64_t>(b.timeout_s * 1e9);
  k.status = status_dev_;
  return k;
}

// The transfers become chains (those posting one flag, in order) that run
// as the blocks of one launch. Up to kIpcSmallBatch go as the kernel's
// parameters; more go up as a table with the stream's own copy (pageable
// source: staged before the call returns, so the vector may go, though the
// driver may first wait for the stream), which the stream orders after the
// launch that read the previous table.
void CudaIpcMemory::transfers(const std::vector<IpcTransfer>& ts, const IpcBounds& b) {
  if (ts.empty()) return;
  std::vector<cuda::IpcKernelTransfer> k(ts.size());
  std::vector<int32_t> heads;
  std::map<const uint64_t*, int32_t> tail_of;  // post flag -> last transfer of its chain
  for (size_t i = 0; i < ts.size(); ++i) {
    const IpcTransfer& t = ts[i];
    k[i] = {t.wait.flag, t.wait.at_least, t.dst,        t.src,         t.nbytes,    t.post.flag, t.post.value,
            t.wait.check, t.wait.check_value, t.stamp, t.stamp_value, t.wait.peer, -1};
    auto it = t.post.flag ? tail_of.find(t.post.flag) : tail_of.end();
    if (it != tail_of.end()) {
      k[it->second].next = static_cast<int32_t>(i);
      it->second = static_cast<int32_t>(i);
    } else {
      heads.push_back(static_cast<int32_t>(i));
      if (t.post.flag) tail_of[t.post.flag] = static_cast<int32_t>(i);
    }
  }
  cuda::DeviceGuard g(device_);
  if (k.size() <= static_cast<size_t>(cuda::kIpcSmallBatch)) {
    cuda::IpcSmallBatch batch{};
    std::copy(k.begin(), k.end(), batch.t);
    std::copy(heads.begin(), heads.end(), batch.heads);
    cuda::ipc_small_transfers(batch, static_cast<int>(heads.size()), kernel_bounds(b), stream_);
    return;
  }
  const size_t need = k.size() + (heads.size() * sizeof(int32_t) + sizeof(k[0]) - 1) / sizeof(k[0]);
  if (need > table_cap_) {
    if (table_) {
      cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (cuda_ipc table)");
      cudaFree(table_);
      table_ = nullptr;
    }
    const size_t cap = std::max<size_t>(need, 1024);
    cuda::check(cudaMalloc(reinterpret_cast<void**>(&table_), cap * sizeof(k[0])), "cudaMalloc (cuda_ipc table)");
    table_cap_ = cap;
  }
  auto* heads_dev = reinterpret_cast<int32_t*>(table_ + k.size());
  cuda::check(cudaMemcpyAsync(table_, k.data(), k.size() * sizeof(k[0]), cudaMemcpyHostToDevice, stream_),
              "cudaMemcpyAsync (cuda_ipc table)");
  cuda::check(cudaMemcpyAsync(heads_dev, heads.data(), heads.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "cudaMemcpyAsync (cuda_ipc heads)");
  cuda::ipc_transfers(table_, heads_dev, static_cast<int>(heads.size()), kernel_bounds(b), stream_);
}

void CudaIpcMemory::wait_all(const std::vector<IpcWait>& ws, const IpcBounds& b) {
  std::vector<const uint64_t*> flags, checks;
  std::vector<uint64_t> at_least, check_values;
  std::vector<int32_t> peers;
  for (const IpcWait& w : ws) {
    flags.push_back(w.flag);
    at_least.push_back(w.at_least);
    checks.push_back(w.check);
    check_values.push_back(w.check_value);
    peers.push_back(w.peer);
  }
  cuda::DeviceGuard g(device_);
  cuda::ipc_wait_all(flags.data(), at_least.data(), checks.data(), check_values.data(), peers.data(),
                     static_cast<int>(ws.size()), kernel_bounds(b), stream_);
}

void CudaIpcMemory::post_all(const std::vector<IpcPost>& ps) {
  std::vector<uint64_t*> flags;
  std::vector<uint64_t> values;
  for (const IpcPost& p : ps) {
    flags.push_back(p.flag);
    values.push_back(p.value);
  }
  cuda::DeviceGuard g(device_);
  cuda::ipc_post_all(flags.data(), values.data(), static_cast<int>(ps.size()), stream_);
}

void CudaIpcMemory::set_words(const std::vector<uint64_t*>& words, uint64_t value) {
  cuda::DeviceGuard g(device_);
  cuda::RelaxedCaptureMode relaxed;
  cuda::ipc_set_words(words.data(), static_cast<int>(words.size()), value, side_);
  cuda::check(cudaStreamSynchronize(side_), "cudaStreamSynchronize (cuda_ipc abort)");
}

uint64_t CudaIpcMemory::read_word(const uint64_t* word) {
  uint64_t v = 0;
  read_bytes(&v, word, sizeof v);
  return v;
}

void CudaIpcMemory::read_bytes(void* dst, const void* src, size_t n) {
  cuda::DeviceGuard g(device_);
  cuda::RelaxedCaptureMode relaxed;
  cuda::check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, side_), "cudaMemcpyAsync (cuda_ipc read)");
  cuda::check(cudaStreamSynchronize(side_), "cudaStreamSynchronize (cuda_ipc read)");
}

void CudaIpcMemory::write_bytes(void* dst, const void* src, size_t n) {
  cuda::DeviceGuard g(device_);
  cuda::RelaxedCaptureMode relaxed;
  cuda::check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, side_), "cudaMemcpyAsync (cuda_ipc write)");
  cuda::check(cudaStreamSynchronize(side_), "cudaStreamSynchronize (cuda_ipc write)");
}

uint64_t CudaIpcMemory::failure() {
  return status_host_ ? static_cast<uint64_t>(*reinterpret_cast<volatile unsigned long long*>(status_host_)) : 0;
}

}  // namespace ringcomm
