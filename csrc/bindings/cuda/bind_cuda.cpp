// The GPU path's bindings (compiled with CUDA only): device queries, NCCL
// loading and unique ids, GpuCommunicator and GpuWork. Buffers arrive as
// (pointer, count, dtype) integers read in Python from torch tensors, cupy
// arrays or __cuda_array_interface__; streams as their integer handles.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <utility>
#include <vector>

#include "bindings/bind.h"
#include "bindings/calls.h"
#include "comm/chooser.h"
#include "comm/cuda/gpu_communicator.h"
#include "common/cuda/cuda_util.h"
#include "reduce/cuda/kernels.h"
#include "transport/nccl/nccl_api.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

Buffer dev_buffer(uintptr_t ptr, size_t count, int dtype) {
  if (dtype < 0 || dtype >= kNumDataTypes) throw ValueError("dtype " + std::to_string(dtype) + " is not a DataType");
  Buffer b;
  b.ptr = reinterpret_cast<char*>(ptr);
  b.count = count;
  b.dtype = static_cast<DataType>(dtype);
  b.present = true;
  return b;
}

ReduceOp op_of(int op) {
  if (op < 0 || op >= kNumReduceOps) throw ValueError("op " + std::to_string(op) + " is not a ReduceOp");
  return static_cast<ReduceOp>(op);
}

cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

void bind_cuda(py::module_& m) {
  m.def("cuda_device_count", [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return n;
  });
  m.def("cuda_versions", [] {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    // Why no device is seen, when none is ("CUDA driver version is
    // insufficient for CUDA runtime version", "no CUDA-capable device").
    int devices = 0;
    const cudaError_t query = cudaGetDeviceCount(&devices);
    cudaGetLastError();
    py::dict d;
    d["runtime"] = runtime;
    d["driver"] = driver;
    d["device_query"] = std::string(cudaGetErrorString(query));
    return d;
  });
  m.def("cuda_pointer_device", [](uintptr_t ptr) {
    cudaPointerAttributes attr{};
    cuda::check(cudaPointerGetAttributes(&attr, reinterpret_cast<void*>(ptr)), "cudaPointerGetAttributes");
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
      throw ValueError("ringcomm: the buffer's memory is not CUDA device memory");
    }
    return attr.device;
  });
  // Which GPU a device index is, across processes with other CUDA_VISIBLE_DEVICES
  // (ranks that share one GPU need cuda_ipc: ringcomm/cuda_ipc.py).
  m.def("cuda_pci_bus_id", [](int device) {
    char bus[32] = {};
    cuda::check(cudaDeviceGetPCIBusId(bus, sizeof bus, device), "cudaDeviceGetPCIBusId");
    return std::string(bus);
  });
  m.def("nccl_set_search_paths", [](std::vector<std::string> paths) { nccl::set_search_paths(std::move(paths)); });
  m.def("nccl_version", [] {
    const nccl::Api& a = nccl::api();
    return py::make_tuple(a.version, a.path);
  });
  m.def("nccl_unique_id", [] { return py::bytes(NcclComm::new_unique_id()); });
  // Test hooks for DeviceGuard (tests/test_gpu.py): whether a device's primary
  // context is active, and (device inside a guard of `device`, device after it).
  m.def("_primary_context_active", [](int device) { return cuda::has_primary_context(device); });
  m.def("_device_guard_probe", [](int device) {
    int inside = -1, after = -1;
    {
      cuda::DeviceGuard g(device);
      cuda::check(cudaGetDevice(&inside), "cudaGetDevice");
    }
    cuda::check(cudaGetDevice(&after), "cudaGetDevice");
    return py::make_tuple(inside, after);
  });
  // The CUDA kernels alone, for tests: dst <- a (op) b, then / divisor for AVG.
  m.def("cuda_local_reduce", [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, int dtype, int op,
                                int divisor, uintptr_t stream) {
    const DataType t = dev_buffer(dst, count, dtype).dtype;
    const ReduceOp o = op_of(op);
    if (!reduce_op_supported(t, o)) throw ValueError("reduce op not defined for this dtype");
    without_gil([&] {
      cuda::reduce(t, o == ReduceOp::kAvg ? ReduceOp::kSum : o, reinterpret_cast<void*>(dst),
                   reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b), count, stream_of(stream));
      if (o == ReduceOp::kAvg) cuda::divide(t, reinterpret_cast<void*>(dst), count, divisor, stream_of(stream));
    });
  });

  py::class_<GpuWork, std::shared_ptr<GpuWork>>(m, "GpuWork", py::dynamic_attr())
      .def("wait_stream", [](GpuWork& w, uintptr_t s) { w.wait_stream(stream_of(s)); })
      .def("synchronize", [](GpuWork& w, double t) { return without_gil([&] { return w.synchronize(t); }); },
           py::arg("timeout_s") = -1.0)
      .def("wait_host", [](GpuWork& w, double t) { return without_gil([&] { return w.wait_host(t); }); },
           py::arg("timeout_s") = -1.0)
      .def("is_completed", &GpuWork::is_completed)
      .def("error", &GpuWork::error)
      .def("error_is_timeout", &GpuWork::error_is_timeout)
      .def_property_readonly("seq", &GpuWork::seq)
      .def_property_readonly("captured", &GpuWork::captured)
      .def_property_readonly("what", &GpuWork::what);

  using G = GpuCommunicator;
  py::class_<G, std::shared_ptr<G>>(m, "GpuCommunicator")
      .def(py::init([](int rank, int world, int device, py::bytes uid, double timeout_s, size_t chunk_bytes,
                       const std::string& algo) {
             std::string id = uid;
             const Algo a = parse_device_algo(Device::kNccl, algo, "RINGCOMM_GPU_ALGO");
             return without_gil([&] { return std::make_shared<G>(rank, world, device, id, timeout_s, chunk_bytes, a); });  // ncclCommInitRank waits for every rank
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("device"), py::arg("unique_id"), py::arg("timeout_s"),
           py::arg("chunk_bytes"), py::arg("algo"))
      .def_static(
          "over_cuda_ipc",
          [](int rank, int world, int device, double timeout_s, size_t slot_bytes, int nslots, size_t stage_bytes,
             size_t one_shot_max, size_t two_shot_max, const std::string& ipc_algo) {
            const Algo a = parse_device_algo(Device::kIpc, ipc_algo, "RINGCOMM_IPC_ALGO");
            return without_gil([&] { return std::make_shared<G>(rank, world, device, timeout_s, IpcGeometry{slot_bytes, nslots, stage_bytes},
                                       IpcThresholds{one_shot_max, two_shot_max}, a); });
          },
          py::arg("rank"), py::arg("world_size"), py::arg("device"), py::arg("timeout_s"), py::arg("slot_bytes"),
          py::arg("nslots"), py::arg("stage_bytes"), py::arg("one_shot_max"), py::arg("two_shot_max"),
          py::arg("ipc_algo") = "auto")
      .def_property_readonly("over_ipc", &G::over_ipc)
      .def("handle", &G::ipc_handle)
      .def("connect", [](G& g, const std::vector<std::string>& handles) { without_gil([&] { g.ipc_connect(handles); }); })
      .def("exported", &G::ipc_exported)
      .def_property_readonly("stream", [](const G& g) { return reinterpret_cast<uintptr_t>(g.stream()); })
      .def_property_readonly("device", &G::device)
      .def("async_error", &G::async_error)
      .def("abort", [](G& g, const std::string& why) { without_gil([&] { g.abort(why); }); })
      .def("close", [](G& g) { without_gil([&] { g.close(); }); })
      // The chooser over this communicator's device and settings (comm/chooser.h).
      .def("choose", [](const G& g, const std::string& op, size_t nbytes, int dtype, int redop, const std::string& algo) {
        if (dtype < 0 || dtype >= kNumDataTypes) throw ValueError("dtype " + std::to_string(dtype) + " is not a DataType");
        return std::string(algo_name(g.choose(collective_arg(op, false), parse_gpu_call_algo(algo),
                                              static_cast<DataType>(dtype), op_of(redop), nbytes)));
      }, py::arg("op"), py::arg("nbytes"), py::arg("dtype"), py::arg("redop") = 0, py::arg("algo") = "auto")
      .def("explain", [](const G& g, const std::string& op, size_t nbytes, int dtype, int redop, const std::string& algo) {
        if (dtype < 0 || dtype >= kNumDataTypes) throw ValueError("dtype " + std::to_string(dtype) + " is not a DataType");
        std::vector<std::pair<std::string, double>> out;
        for (const Candidate& c : g.explain(collective_arg(op, false), parse_gpu_call_algo(algo),
                                            static_cast<DataType>(dtype), op_of(redop), nbytes)) {
          out.emplace_back(algo_name(c.algo), c.seconds);
        }
        return out;
      }, py::arg("op"), py::arg("nbytes"), py::arg("dtype"), py::arg("redop") = 0, py::arg("algo") = "auto")
      .def(
          "all_reduce",
          [](G& g, uintptr_t p, size_t n, int t, int op, uintptr_t s, const std::string& algo) {
            const Algo a = parse_gpu_call_algo(algo);
            return without_gil([&] { return g.all_reduce(dev_buffer(p, n, t), op_of(op), stream_of(s), a); });
          },
          py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("stream"), py::arg("algo"))
      .def("reduce_scatter", [](G& g, uintptr_t op_, size_t on, uintptr_t ip, size_t in, int t, int op, uintptr_t s,
                                const std::string& algo) {
        const Algo a = parse_gpu_call_algo(algo);
        return without_gil([&] { return g.reduce_scatter(dev_buffer(op_, on, t), dev_buffer(ip, in, t), op_of(op), stream_of(s), a); });
      })
      .def("all_gather", [](G& g, uintptr_t op_, size_t on, uintptr_t ip, size_t in, int t, uintptr_t s,
                            const std::string& algo) {
        const Algo a = parse_gpu_call_algo(algo);
        return without_gil([&] { return g.all_gather(dev_buffer(op_, on, t), dev_buffer(ip, in, t), stream_of(s), a); });
      })
      .def("broadcast", [](G& g, uintptr_t p, size_t n, int t, int root, uintptr_t s, const std::string& algo) {
        const Algo a = parse_gpu_call_algo(algo);
        return without_gil([&] { return g.broadcast(dev_buffer(p, n, t), root, stream_of(s), a); });
      })
      .def("reduce", [](G& g, uintptr_t p, size_t n, int t, int root, int op, uintptr_t s, const std::string& algo) {
        const Algo a = parse_gpu_call_algo(algo);
        return without_gil([&] { return g.reduce(dev_buffer(p, n, t), root, op_of(op), stream_of(s), a); });
      })
      .def("scatter", [](G& g, uintptr_t op_, size_t on, uintptr_t ip, size_t in, int t, int root, uintptr_t s) {
        return without_gil([&] { return g.scatter(dev_buffer(op_, on, t), dev_buffer(ip, in, t), root, stream_of(s)); });
      })
      .def("gather", [](G& g, uintptr_t op_, size_t on, uintptr_t ip, size_t in, int t, int root, uintptr_t s) {
        return without_gil([&] { return g.gather(dev_buffer(op_, on, t), dev_buffer(ip, in, t), root, stream_of(s)); });
      })
      .def("all_to_all", [](G& g, uintptr_t op_, size_t on, uintptr_t ip, size_t in, int t, uintptr_t s) {
        return without_gil([&] { return g.all_to_all(dev_buffer(op_, on, t), dev_buffer(ip, in, t), stream_of(s)); });
      })
      .def("send", [](G& g, uintptr_t p, size_t n, int t, int peer, uintptr_t s) {
        return without_gil([&] { return g.send(dev_buffer(p, n, t), peer, stream_of(s)); });
      })
      .def("recv", [](G& g, uintptr_t p, size_t n, int t, int peer, uintptr_t s) {
        return without_gil([&] { return g.recv(dev_buffer(p, n, t), peer, stream_of(s)); });
      })
      .def("sendrecv", [](G& g, uintptr_t sp, size_t sn, int st, int dst, uintptr_t rp, size_t rn, int rt, int src,
                          uintptr_t s) {
        return without_gil([&] { return g.sendrecv(dev_buffer(sp, sn, st), dst, dev_buffer(rp, rn, rt), src, stream_of(s)); });
      });
}

}  // namespace ringcomm
