// Test hooks for the GPU path's logic, which runs without a GPU: one collective
// of the GPU "ring" family through the device executor over the in-process
// NCCL stand-in (comm/device_sim.h), all ranks on threads of this process, on
// numpy buffers; and the rule that picks a GPU call's family (comm/gpu_algo.h).
// Not part of the public API.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <thread>

#include "bindings/bind.h"
#include "bindings/buffers.h"
#include "comm/call_plan.h"
#include "comm/device_sim.h"
#include "comm/gpu_algo.h"

namespace py = pybind11;

namespace ringcomm {

void bind_device_sim(py::module_& m) {
  m.def(
      "_simulate_device_call",
      [](const std::string& kind, py::list outs, py::list ins, int op, int root, size_t chunk_bytes,
         double timeout_s, const std::string& algo) {
        const int world = static_cast<int>(outs.size());
        static const std::pair<const char*, OpKind> kinds[] = {
            {"all_reduce", OpKind::kAllReduce}, {"reduce_scatter", OpKind::kReduceScatter},
            {"all_gather", OpKind::kAllGather}, {"broadcast", OpKind::kBroadcast},
            {"reduce", OpKind::kReduce},         {"scatter", OpKind::kScatter},
            {"gather", OpKind::kGather},         {"all_to_all", OpKind::kAllToAll}};
        OpKind k{};
        bool found = false;
        for (auto& [n, v] : kinds) {
          if (kind == n) k = v, found = true;
        }
        if (!found) throw ValueError("unknown call " + kind);
        const Algo family = parse_algo_choice(algo).of(k);
        std::vector<Buffer> o(world), i(world);
        for (int r = 0; r < world; ++r) {
          o[r] = buffer_from_python(outs[r], "out", true, true);
          i[r] = buffer_from_python(ins[r], "in", false, true);
        }
        const DataType dtype = (o[0].present ? o[0] : i[0]).dtype;
        const ReduceOp rop = static_cast<ReduceOp>(op);
        SimFabric fabric(world, timeout_s);
        std::vector<std::exception_ptr> errors(world);
        py::gil_scoped_release release;
        std::vector<std::thread> threads;
        for (int r = 0; r < world; ++r) {
          threads.emplace_back([&, r] {
            try {
              const size_t elem = dtype_size(dtype);
              CallPlan call;
              call.kind = k;
              call.out = o[r].ptr;
              call.in = i[r].ptr;
              call.root = root;
              call.avg = rop == ReduceOp::kAvg;
              const bool by_input = k == OpKind::kAllGather || k == OpKind::kGather || k == OpKind::kAllToAll;
              call.count = by_input ? i[r].count : o[r].count;
              call.algo = family;
              std::vector<char> scratch(2 * call.count * elem + 1);  // host memory stands in for the device's
              call.scratch = scratch.data();
              MsgTag tag;
              Schedule steps;
              PlanContext ctx{r, world, elem, std::max<size_t>(1, chunk_bytes / elem), &tag, &steps, nullptr};
              plan_call(ctx, call);
              DeviceExecutor ex(chunk_bytes);
              SimOps ops(&fabric, r);
              ex.run(steps, ops, dtype, rop);
            } catch (...) {
              errors[r] = std::current_exception();
            }
          });
        }
        for (auto& t : threads) t.join();
        for (auto& e : errors) {
          if (e) std::rethrow_exception(e);
        }
      },
      py::arg("kind"), py::arg("outs"), py::arg("ins"), py::arg("op"), py::arg("root"), py::arg("chunk_bytes"),
      py::arg("timeout_s") = 10.0, py::arg("algo") = "auto");
  // GpuCommunicator::choose without a communicator: "nccl" or "ring", or the
  // ValueError a GPU call would raise.
  m.def(
      "_gpu_family",
      [](const std::string& algo, const std::string& communicator_default, int dtype, int op, bool reduces) {
        if (dtype < 0 || dtype >= kNumDataTypes || op < 0 || op >= kNumReduceOps) {
          throw ValueError("_gpu_family: dtype or op code out of range");
        }
        return std::string(gpu_algo_name(choose_gpu_family(parse_gpu_algo(algo), parse_gpu_algo(communicator_default),
                                                           static_cast<DataType>(dtype), static_cast<ReduceOp>(op),
                                                           reduces)));
      },
      py::arg("algo"), py::arg("communicator_default"), py::arg("dtype"), py::arg("op"), py::arg("reduces"));
}

}  // namespace ringcomm
