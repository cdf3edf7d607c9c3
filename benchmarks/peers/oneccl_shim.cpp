// A C entry point per oneCCL call the sweep times, for ctypes (ringcomm.bench.oneccl).
//
// Nothing of oneCCL is reimplemented: each function makes the one oneCCL C++
// API call that a oneCCL user makes (ccl::allreduce(...).wait() and so on),
// on a communicator created as oneCCL's users create it: rank 0 makes the
// main key-value store (ccl::create_main_kvs), its address goes to the other
// ranks through the job's store, they attach (ccl::create_kvs), and every
// rank calls ccl::create_communicator(size, rank, kvs). torch-ccl does the same.
//
// Built against the oneccl-cpu-devel package's headers and static library:
//   g++ -O2 -std=c++17 -shared -fPIC oneccl_shim.cpp -I<prefix>/include \
//       <prefix>/lib/ccl/cpu/lib/libccl.a -o oneccl_shim.so -ldl -lpthread
// Every function returns 0, or -1 with the exception's text in rc_ccl_error().
#include <oneapi/ccl.hpp>

#include <cstring>
#include <exception>
#include <memory>
#include <string>

namespace {

std::string g_error;
std::shared_ptr<ccl::kvs> g_kvs;
std::unique_ptr<ccl::communicator> g_comm;

template <class F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
  } catch (...) {
    g_error = "unknown C++ exception";
  }
  return -1;
}

ccl::datatype dtype_of(int d) { return static_cast<ccl::datatype>(d); }
ccl::reduction op_of(int r) { return static_cast<ccl::reduction>(r); }

}  // namespace

extern "C" {

const char* rc_ccl_error() { return g_error.c_str(); }

// "2022.2.0 (...)": the library's own version string.
int rc_ccl_version(char* out, int n) {
  return guarded([&] {
    ccl::library_version v = ccl::get_library_version();
    std::string s = std::string(v.full ? v.full : "") + " (" + (v.build_date ? v.build_date : "") + ")";
    std::strncpy(out, s.c_str(), static_cast<size_t>(n) - 1);
    out[n - 1] = '\0';
  });
}

int rc_ccl_init() { return guarded([] { ccl::init(); }); }

// Rank 0: creates the main KVS and writes its address (addr_len bytes).
int rc_ccl_main_kvs(char* addr, int addr_len) {
  return guarded([&] {
    g_kvs = ccl::create_main_kvs();
    ccl::kvs::address_type a = g_kvs->get_address();
    if (static_cast<size_t>(addr_len) < a.size()) throw std::runtime_error("address buffer too small");
    std::memcpy(addr, a.data(), a.size());
  });
}

int rc_ccl_address_size() { return static_cast<int>(ccl::kvs::address_max_size); }

// Every rank: attaches to rank 0's KVS (rank 0 already holds it) and makes the communicator.
int rc_ccl_communicator(int size, int rank, const char* addr, int addr_len) {
  return guarded([&] {
    if (!g_kvs) {
      ccl::kvs::address_type a;
      if (static_cast<size_t>(addr_len) != a.size()) throw std::runtime_error("bad KVS address size");
      std::memcpy(a.data(), addr, a.size());
      g_kvs = ccl::create_kvs(a);
    }
    g_comm = std::make_unique<ccl::communicator>(ccl::create_communicator(size, rank, g_kvs));
  });
}

int rc_ccl_free() {
  return guarded([] {
    g_comm.reset();
    g_kvs.reset();
  });
}

int rc_ccl_allreduce(const void* in, void* out, size_t count, int dtype, int op) {
  return guarded([&] { ccl::allreduce(in, out, count, dtype_of(dtype), op_of(op), *g_comm).wait(); });
}

int rc_ccl_reduce_scatter(const void* in, void* out, size_t recv_count, int dtype, int op) {
  return guarded([&] { ccl::reduce_scatter(in, out, recv_count, dtype_of(dtype), op_of(op), *g_comm).wait(); });
}

int rc_ccl_allgather(const void* in, void* out, size_t send_count, int dtype) {
  return guarded([&] { ccl::allgather(in, out, send_count, dtype_of(dtype), *g_comm).wait(); });
}

int rc_ccl_broadcast(void* buf, size_t count, int dtype, int root) {
  return guarded([&] { ccl::broadcast(buf, count, dtype_of(dtype), root, *g_comm).wait(); });
}

int rc_ccl_reduce(const void* in, void* out, size_t count, int dtype, int op, int root) {
  return guarded([&] { ccl::reduce(in, out, count, dtype_of(dtype), op_of(op), root, *g_comm).wait(); });
}

int rc_ccl_alltoall(const void* in, void* out, size_t count, int dtype) {
  return guarded([&] { ccl::alltoall(in, out, count, dtype_of(dtype), *g_comm).wait(); });
}

int rc_ccl_barrier() {
  return guarded([] { ccl::barrier(*g_comm).wait(); });
}

}  // extern "C"
