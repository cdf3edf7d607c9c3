// Test hooks for the GPU path's logic that runs without a GPU. Not part of the
// public API.
// - _simulate_device_call: one collective of the GPU "ring" family through
//   the device executor over the in-process NCCL stand-in (testing/device_sim.h),
//   all ranks on threads of this process, on numpy buffers;
// - _FaultRecord / _AbortGate: the GPU communicator's fault bookkeeping
//   (comm/fault_state.h); the gate's teardown here marks a stand-in handle
//   dead, and _abort_gate_race checks on threads that no user ever sees it
//   dead while inside.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "bindings/bind.h"
#include "bindings/buffers.h"
#include "comm/call_plan.h"
#include "comm/fault_state.h"
#include "testing/device_sim.h"

namespace py = pybind11;

namespace ringcomm {

namespace {

// An AbortGate whose teardown counts itself and records how many users were
// inside when it ran (must be 0).
struct GateProbe {
  AbortGate gate;
  std::atomic<int> inside{0};
  int teardowns = 0;
  int destroys = 0;
  int users_at_teardown = -1;
  void teardown() {
    ++teardowns;
    users_at_teardown = inside.load();
  }
};

void bind_fault_state(py::module_& m) {
  py::class_<FaultRecord>(m, "_FaultRecord")
      .def(py::init<>())
      .def("set", &FaultRecord::set, py::arg("why"), py::arg("timeout"), py::arg("finished"))
      .def("failed", &FaultRecord::failed)
      .def("message", &FaultRecord::message)
      .def("error_of", &FaultRecord::error_of)
      .def("timeout", &FaultRecord::timeout);
  py::class_<GateProbe>(m, "_AbortGate")
      .def(py::init<>())
      .def("enter", [](GateProbe& p) {
        const bool ok = p.gate.enter();
        if (ok) ++p.inside;
        return ok;
      })
      .def("leave", [](GateProbe& p) {
        --p.inside;
        p.gate.leave();
      })
      .def("abort", [](GateProbe& p) { p.gate.abort([&p] { p.teardown(); }); })
      .def("retire", [](GateProbe& p) { p.gate.retire([&p] { ++p.destroys; }); },
           py::call_guard<py::gil_scoped_release>())
      .def("aborted", [](GateProbe& p) { return p.gate.aborted(); })
      .def_property_readonly("teardowns", [](const GateProbe& p) { return p.teardowns; })
      .def_property_readonly("destroys", [](const GateProbe& p) { return p.destroys; })
      .def_property_readonly("users_at_teardown", [](const GateProbe& p) { return p.users_at_teardown; });
  // `users` threads enter, touch the stand-in handle, leave, in a loop; one
  // more aborts after `abort_after_us`. Returns (uses of a dead handle, uses
  // in all, teardowns): a safe gate gives (0, >0, 1).
  m.def(
      "_abort_gate_race",
      [](int users, int abort_after_us) {
        AbortGate gate;
        std::atomic<bool> alive{true};
        std::atomic<int> dead_uses{0}, uses{0}, teardowns{0};
        {
          py::gil_scoped_release release;
          std::vector<std::thread> threads;
          for (int t = 0; t < users; ++t) {
            threads.emplace_back([&] {
              while (gate.enter()) {  // until the abort
                for (int i = 0; i < 50; ++i) {  // a call queuing work on the handle
                  if (!alive) ++dead_uses;
                  ++uses;
                }
                gate.leave();
              }
            });
          }
          std::this_thread::sleep_for(std::chrono::microseconds(abort_after_us));
          gate.abort([&] {
            alive = false;
            ++teardowns;
          });
          gate.abort([&] { ++teardowns; });  // a second abort does nothing
          for (auto& t : threads) t.join();
          gate.retire([&] { ++teardowns; });  // nothing to destroy after an abort
        }
        return py::make_tuple(dead_uses.load(), uses.load(), teardowns.load());
      },
      py::arg("users"), py::arg("abort_after_us"));
}

}  // namespace

void bind_device_sim(py::module_& m) {
  bind_fault_state(m);
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
              AddressedCall call;
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
              Schedule steps;
              PlanContext ctx{r, world, elem, std::max<size_t>(1, chunk_bytes / elem), &steps};
              plan_call(ctx, plan_of(call, elem, world));
              DeviceExecutor ex(chunk_bytes);
              SimOps ops(&fabric, r);
              ex.run(steps, buffers_of(call), ops, dtype, rop);
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
}

}  // namespace ringcomm
