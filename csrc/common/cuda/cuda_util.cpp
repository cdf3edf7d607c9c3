#include "common/cuda/cuda_util.h"

#include <dlfcn.h>

#include <mutex>

namespace ringcomm::cuda {
namespace {

// The driver's types, spelled here so that no cuda.h is needed.
using DriverDevice = int;
using DeviceGetFn = int (*)(DriverDevice* device, int ordinal);
using PrimaryCtxGetStateFn = int (*)(DriverDevice device, unsigned int* flags, int* active);

struct DriverFns {
  DeviceGetFn device_get = nullptr;
  PrimaryCtxGetStateFn primary_ctx_get_state = nullptr;
};

// From libcuda.so.1 itself (the static runtime has loaded it already), not
// through cudaGetDriverEntryPoint: a runtime call may create the very context
// on the current device that this check is there to avoid.
const DriverFns& driver_fns() {
  static DriverFns fns;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto* get = reinterpret_cast<DeviceGetFn>(dlsym(lib, "cuDeviceGet"));
    auto* state = reinterpret_cast<PrimaryCtxGetStateFn>(dlsym(lib, "cuDevicePrimaryCtxGetState"));
    if (get && state) {
      fns.device_get = get;
      fns.primary_ctx_get_state = state;
    }
  });
  return fns;
}

}  // namespace

bool has_primary_context(int device) {
  const DriverFns& f = driver_fns();
  if (!f.device_get || !f.primary_ctx_get_state) return true;
  DriverDevice d = 0;
  unsigned int flags = 0;
  int active = 1;
  const int r = f.device_get(&d, device);
  constexpr int kNotInitialized = 3;  // CUDA_ERROR_NOT_INITIALIZED: no cuInit yet, so no context at all
  if (r == kNotInitialized) return false;
  if (r != 0 || f.primary_ctx_get_state(d, &flags, &active) != 0) return true;
  return active != 0;
}

}  // namespace ringcomm::cuda
