// Test hook: the cuda_ipc transport's protocol over host shared memory
// between real processes (transport/cuda_ipc/host_ipc_memory.h), on numpy
// buffers, with every collective of comm/ipc_collectives.h. Not part of the
// public API: the tests (tests/test_cuda_ipc.py) and scripts/gpu_check.sh's
// CPU rehearsal drive it; the GPU communicator runs the same code over CUDA
// memory.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "bindings/bind.h"
#include "bindings/buffers.h"
#include "comm/call_check.h"
#include "comm/chooser.h"
#include "comm/ipc_collectives.h"
#include "transport/cuda_ipc/host_ipc_memory.h"

namespace py = pybind11;

namespace ringcomm {

namespace {

class IpcHostComm {
 public:
  IpcHostComm(int rank, int world, size_t slot_bytes, int nslots, size_t stage_bytes, double timeout_s,
              size_t one_shot_max, size_t two_shot_max) {
    auto mem = std::make_unique<HostIpcMemory>();
    mem_ = mem.get();
    IpcGeometry g{slot_bytes, nslots, stage_bytes};
    auto ch = std::make_unique<IpcChannel>(rank, world, g, timeout_s, std::move(mem));
    coll_ = std::make_unique<IpcCollectives>(std::move(ch), IpcThresholds{one_shot_max, two_shot_max});
    coll_->allocate();
  }

  IpcChannel& ch() { return coll_->channel(); }
  std::string linked_name() const { return mem_->linked_name(); }
  IpcCollectives& coll() { return *coll_; }
  // What an all_reduce of `nbytes` runs under `algo`, as the GPU communicator decides it (comm/chooser.h).
  Algo choose(size_t nbytes, Algo algo) const {
    ChoiceContext ctx;
    ctx.device = Device::kIpc;
    ctx.configured = algo;
    ctx.ipc = coll_->thresholds();
    ctx.ipc_stage_bytes = coll_->channel().geometry().stage_bytes;
    ChoiceCall call;
    call.kind = OpKind::kAllReduce;
    call.bytes = nbytes;
    return ringcomm::choose(ctx, call);
  }

  // Runs one call: refuses at once after an error, and any error poisons.
  template <class F>
  void call(F&& f) {
    if (closed_) throw Error("ringcomm: the cuda_ipc stand-in is closed");
    const std::string earlier = ch().failure();
    if (!earlier.empty()) throw Error("ringcomm: cuda_ipc is unusable after an earlier error (" + earlier + ")");
    try {
      f(++seq_);
    } catch (const ValueError&) {
      throw;  // rejected before anything moved
    } catch (const TypeError&) {
      throw;
    } catch (const Error& e) {
      ch().abort(e.what());
      throw;
    }
  }
  void close() {
    closed_ = true;
    ch().release();
  }

 private:
  HostIpcMemory* mem_;
  std::unique_ptr<IpcCollectives> coll_;
  uint64_t seq_ = 0;
  bool closed_ = false;
};

}  // namespace

void bind_ipc_sim(py::module_& m) {
  py::class_<IpcHostComm>(m, "_IpcHostComm")
      .def(py::init<int, int, size_t, int, size_t, double, size_t, size_t>(), py::arg("rank"), py::arg("world_size"),
           py::arg("slot_bytes"), py::arg("nslots"), py::arg("stage_bytes"), py::arg("timeout_s"),
           py::arg("one_shot_max"), py::arg("two_shot_max"))
      .def("handle", [](IpcHostComm& c) { return c.ch().handle(); })
      .def("linked_name", &IpcHostComm::linked_name)
      .def("connect", [](IpcHostComm& c, std::vector<std::string> h) { c.ch().connect(h); })
      .def("exported", [](IpcHostComm& c) { c.ch().exported(); })
      .def("choose", [](IpcHostComm& c, size_t nbytes, const std::string& algo) {
        return std::string(algo_name(c.choose(nbytes, parse_device_algo(Device::kIpc, algo, "algo"))));
      })
      .def(
          "all_reduce",
          [](IpcHostComm& c, py::object x, int op, const std::string& algo, const std::string& family) {
            Buffer b = buffer_from_python(x, "tensor", true);
            const Algo requested = parse_device_algo(Device::kIpc, algo, "algo");
            const Algo fam = parse_algo_choice(family).of(OpKind::kAllReduce);
            const ReduceOp rop = static_cast<ReduceOp>(op);
            if (!reduce_op_supported(b.dtype, rop)) throw ValueError("reduce op not defined for this dtype");
            py::gil_scoped_release r;
            c.call([&](uint64_t seq) {
              c.coll().all_reduce(seq, b.ptr, b.count, b.dtype, rop, c.choose(b.nbytes(), requested), fam);
            });
          },
          py::arg("tensor"), py::arg("op"), py::arg("algo") = "auto", py::arg("family") = "auto")
      .def(
          "collective",
          [](IpcHostComm& c, const std::string& kind, py::object out, py::object in, int op, int root,
             const std::string& family) {
            const OpKind k = collective_arg(kind, /*barrier_ok=*/false);
            Buffer o = buffer_from_python(out, "output", true, true);
            Buffer i = buffer_from_python(in, "input", false, true);
            const bool by_input = k == OpKind::kAllGather || k == OpKind::kGather || k == OpKind::kAllToAll;
            const DataType dtype = (o.present ? o : i).dtype;
            const ReduceOp rop = static_cast<ReduceOp>(op);
            const int world = c.ch().world();
            check_call(describe_call(k, c.ch().rank(), world, o, i, root, rop));
            AddressedCall call;
            call.kind = k;
            call.out = o.ptr;
            call.in = i.ptr;
            call.count = by_input ? i.count : o.count;
            call.root = root;
            call.avg = rop == ReduceOp::kAvg;
            call.algo = parse_algo_choice(family).of(k);
            py::gil_scoped_release r;
            c.call([&](uint64_t seq) { c.coll().run(kind.c_str(), seq, call, dtype, rop); });
          },
          py::arg("kind"), py::arg("output"), py::arg("input"), py::arg("op"), py::arg("root"),
          py::arg("family") = "auto")
      .def(
          "p2p",
          [](IpcHostComm& c, py::object send, int dst, py::object recv, int src) {
            Buffer s = buffer_from_python(send, "send", false, true);
            Buffer r = buffer_from_python(recv, "recv", true, true);
            std::vector<IpcP2p> ops;
            if (s.present) ops.push_back({true, s.ptr, s.nbytes(), dst});
            if (r.present) ops.push_back({false, r.ptr, r.nbytes(), src});
            py::gil_scoped_release rel;
            c.call([&](uint64_t seq) { c.coll().p2p("sendrecv", seq, ops); });
          },
          py::arg("send"), py::arg("dst"), py::arg("recv"), py::arg("src"))
      .def("abort", [](IpcHostComm& c, const std::string& why) { c.ch().abort(why); })
      .def("failure", [](IpcHostComm& c) { return c.ch().failure(); })
      .def("close", &IpcHostComm::close);
  m.def("_ipc_buffer_bytes", [](int world, size_t slot_bytes, int nslots, size_t stage_bytes) {
    return IpcChannel::buffer_bytes(world, IpcGeometry{slot_bytes, nslots, stage_bytes});
  });
}

}  // namespace ringcomm
