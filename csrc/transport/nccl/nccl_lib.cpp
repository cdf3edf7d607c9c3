// Finds and loads libnccl.so.2 (see nccl_api.h).
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "ringcomm/types.h"
#include "transport/nccl/nccl_api.h"

namespace ringcomm::nccl {
namespace {

std::mutex mu;
std::vector<std::string> extra_paths;
Api loaded{};
bool is_loaded = false;

template <class F>
void resolve(void* lib, const char* name, F*& fn, bool required, const std::string& path) {
  fn = reinterpret_cast<F*>(dlsym(lib, name));
  if (!fn && required) throw Error("ringcomm: " + path + " has no symbol " + name + " (NCCL too old?)");
}

Api load_from(void* lib, const std::string& path) {
  Api a{};
  resolve(lib, "ncclGetVersion", a.GetVersion, true, path);
  resolve(lib, "ncclGetUniqueId", a.GetUniqueId, true, path);
  resolve(lib, "ncclCommInitRank", a.CommInitRank, true, path);
  resolve(lib, "ncclCommDestroy", a.CommDestroy, true, path);
  resolve(lib, "ncclCommAbort", a.CommAbort, true, path);
  resolve(lib, "ncclCommGetAsyncError", a.CommGetAsyncError, true, path);
  resolve(lib, "ncclGetErrorString", a.GetErrorString, true, path);
  resolve(lib, "ncclGetLastError", a.GetLastError, false, path);
  resolve(lib, "ncclAllReduce", a.AllReduce, true, path);
  resolve(lib, "ncclBroadcast", a.Broadcast, true, path);
  resolve(lib, "ncclReduce", a.Reduce, true, path);
  resolve(lib, "ncclAllGather", a.AllGather, true, path);
  resolve(lib, "ncclReduceScatter", a.ReduceScatter, true, path);
  resolve(lib, "ncclSend", a.Send, true, path);
  resolve(lib, "ncclRecv", a.Recv, true, path);
  resolve(lib, "ncclGroupStart", a.GroupStart, true, path);
  resolve(lib, "ncclGroupEnd", a.GroupEnd, true, path);
  int v = 0;
  if (a.GetVersion(&v) != kSuccess) throw Error("ringcomm: ncclGetVersion failed in " + path);
  a.version = v;
  a.path = path;
  if (v < 21000) {
    throw Error("ringcomm: " + path + " is NCCL " + std::to_string(v) + "; ringcomm needs 2.10 or newer");
  }
  return a;
}

}  // namespace

void set_search_paths(std::vector<std::string> paths) {
  std::lock_guard<std::mutex> lk(mu);
  extra_paths = std::move(paths);
}

const Api& api() {
  std::lock_guard<std::mutex> lk(mu);
  if (is_loaded) return loaded;
  // In order: an explicit choice; the copy already in this process (torch's),
  // so both libraries share one NCCL; the wheel's; the loader's search.
  std::vector<std::pair<std::string, int>> tries;
  if (const char* env = std::getenv("RINGCOMM_NCCL_LIBRARY"); env && *env) {
    tries.push_back({env, RTLD_NOW | RTLD_LOCAL});
  } else {
    tries.push_back({"libnccl.so.2", RTLD_NOW | RTLD_NOLOAD});
    for (const std::string& p : extra_paths) tries.push_back({p, RTLD_NOW | RTLD_LOCAL});
    tries.push_back({"libnccl.so.2", RTLD_NOW | RTLD_LOCAL});
  }
  std::string why;
  for (const auto& [path, flags] : tries) {
    void* lib = dlopen(path.c_str(), flags);
    if (!lib) {
      if (!(flags & RTLD_NOLOAD)) why += "\n  " + path + ": " + dlerror();
      continue;
    }
    loaded = load_from(lib, (flags & RTLD_NOLOAD) ? path + " (already loaded)" : path);
    is_loaded = true;
    return loaded;
  }
  throw Error("ringcomm: NCCL (libnccl.so.2) could not be loaded; install nvidia-nccl-cu12 or "
              "nvidia-nccl-cu13 (pip install ringcomm[cuda12] / [cuda13]) or set "
              "RINGCOMM_NCCL_LIBRARY. Tried:" + why);
}

void check(Result r, const char* what, CommHandle comm) {
  if (r == kSuccess) return;
  const Api& a = api();
  std::string msg = std::string("ringcomm: ") + what + " failed: " + a.GetErrorString(r);
  if (comm && a.GetLastError) {
    const char* last = a.GetLastError(comm);
    if (last && *last) msg += std::string(": ") + last;
  }
  throw Error(msg);
}

}  // namespace ringcomm::nccl
