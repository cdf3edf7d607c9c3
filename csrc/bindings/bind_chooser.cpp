// The algorithm chooser for Python (comm/chooser.h): what a GPU call (over
// NCCL or cuda_ipc) runs and why, without a GPU, so the GPU path's choice is
// read, explained and tested on every build; and the one parser of algorithm
// names every device's setting and algo= go through. The CPU communicator's
// own explain() (bind_cost_model.cpp) asks the same chooser with its model.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "bindings/bind.h"
#include "comm/chooser.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

Device device_arg(const std::string& d) {
  if (d == "cpu") return Device::kCpu;
  if (d == "nccl") return Device::kNccl;
  if (d == "cuda_ipc") return Device::kIpc;
  throw ValueError("device '" + d + "' is not one of cpu, nccl, cuda_ipc");
}

// A GPU device's call and context, as GpuCommunicator builds them.
std::pair<ChoiceContext, ChoiceCall> gpu_choice(const std::string& device, const std::string& op, size_t nbytes,
                                                int dtype, int redop, const std::string& algo,
                                                const std::string& configured, size_t one_shot_max,
                                                size_t two_shot_max, size_t stage_bytes) {
  if (dtype < 0 || dtype >= kNumDataTypes) throw ValueError("dtype " + std::to_string(dtype) + " is not a DataType");
  if (redop < 0 || redop >= kNumReduceOps) throw ValueError("op " + std::to_string(redop) + " is not a ReduceOp");
  ChoiceContext ctx;
  ctx.device = device_arg(device);
  if (ctx.device == Device::kCpu) {
    throw ValueError("the CPU's choice needs the communicator's cost model: use Communicator.explain");
  }
  ctx.configured = parse_device_algo(ctx.device, configured,
                                     ctx.device == Device::kNccl ? "RINGCOMM_GPU_ALGO" : "RINGCOMM_IPC_ALGO");
  ctx.ipc = IpcThresholds{one_shot_max, two_shot_max};
  ctx.ipc_stage_bytes = stage_bytes;
  ChoiceCall call;
  call.kind = collective_arg(op, /*barrier_ok=*/false);
  call.bytes = nbytes;
  call.dtype = static_cast<DataType>(dtype);
  call.op = static_cast<ReduceOp>(redop);
  call.reduces = op_reduces(call.kind);
  call.requested = parse_gpu_call_algo(algo);
  return {ctx, call};
}

}  // namespace

Algo parse_gpu_call_algo(const std::string& name) {
  if (name.empty() || name == "auto") return Algo::kAuto;
  Algo a;
  if (!parse_algo_name(name, &a) ||
      (a != Algo::kNccl && a != Algo::kRing && a != Algo::kOneShot && a != Algo::kTwoShot)) {
    throw ValueError("algo '" + name + "' is not one of auto, nccl, ring (NCCL), oneshot, twoshot, ring (cuda_ipc)");
  }
  return a;
}

void bind_chooser(py::module_& m) {
  m.def(
      "parse_algo",
      [](const std::string& device, const std::string& name, const std::string& setting) {
        return std::string(algo_name(parse_device_algo(device_arg(device), name, setting)));
      },
      py::arg("device"), py::arg("name"), py::arg("setting"),
      "The canonical name of an algorithm `device` (cpu, nccl, cuda_ipc) runs; ValueError naming `setting`.");
  m.def("parse_gpu_call_algo", [](const std::string& name) { return std::string(algo_name(parse_gpu_call_algo(name))); },
        py::arg("name"), "A GPU call's algo= name (any GPU device's); ValueError otherwise.");
  const auto args = std::make_tuple(py::arg("device"), py::arg("op"), py::arg("nbytes"), py::arg("dtype"),
                                    py::arg("redop") = 0, py::arg("algo") = "auto", py::arg("configured") = "auto",
                                    py::arg("one_shot_max") = IpcThresholds{}.one_shot_max,
                                    py::arg("two_shot_max") = IpcThresholds{}.two_shot_max,
                                    py::arg("stage_bytes") = size_t{0});
  m.def(
      "choose_algo",
      [](const std::string& device, const std::string& op, size_t nbytes, int dtype, int redop, const std::string& algo,
         const std::string& configured, size_t one_shot_max, size_t two_shot_max, size_t stage_bytes) {
        auto [ctx, call] = gpu_choice(device, op, nbytes, dtype, redop, algo, configured, one_shot_max, two_shot_max,
                                      stage_bytes);
        return std::string(algo_name(choose(ctx, call)));
      },
      std::get<0>(args), std::get<1>(args), std::get<2>(args), std::get<3>(args), std::get<4>(args),
      std::get<5>(args), std::get<6>(args), std::get<7>(args), std::get<8>(args), std::get<9>(args),
      "What a GPU call runs (device nccl or cuda_ipc), or the ValueError the call would raise.");
  m.def(
      "explain_algo",
      [](const std::string& device, const std::string& op, size_t nbytes, int dtype, int redop, const std::string& algo,
         const std::string& configured, size_t one_shot_max, size_t two_shot_max, size_t stage_bytes) {
        auto [ctx, call] = gpu_choice(device, op, nbytes, dtype, redop, algo, configured, one_shot_max, two_shot_max,
                                      stage_bytes);
        std::vector<std::pair<std::string, double>> out;
        for (const Candidate& c : candidates(ctx, call)) out.emplace_back(algo_name(c.algo), c.seconds);
        return out;
      },
      std::get<0>(args), std::get<1>(args), std::get<2>(args), std::get<3>(args), std::get<4>(args),
      std::get<5>(args), std::get<6>(args), std::get<7>(args), std::get<8>(args), std::get<9>(args),
      "A GPU call's candidates, the one it runs first (seconds: NaN, no GPU link is modelled).");
}

}  // namespace ringcomm
