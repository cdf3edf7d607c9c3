// Communicator and Config. Buffers are read with the GIL held, then the GIL
// is released for the whole native call. all_reduce, send and recv are bound
// in bind_fast_calls.cpp; the Work an async call returns in bind_work.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "bindings/buffers.h"
#include "bindings/calls.h"
#include "comm/communicator.h"
#include "transport/shm/segment.h"

namespace py = pybind11;

namespace ringcomm {

void bind_communicator(py::module_& m) {
  py::class_<Config>(m, "Config")
      .def(py::init<>())
      .def_readwrite("slot_bytes", &Config::slot_bytes)
      .def_readwrite("nslots", &Config::nslots)
      .def_readwrite("algo", &Config::algo)
      .def_readwrite("oneshot_max_bytes", &Config::oneshot_max_bytes)
      .def_readwrite("timeout_s", &Config::timeout_s)
      .def_readwrite("transport", &Config::transport)
      .def_readwrite("pull", &Config::pull)
      .def_readwrite("pull_min_bytes", &Config::pull_min_bytes)
      .def_readwrite("p2p_unexpected_bytes", &Config::p2p_unexpected_bytes)
      .def_readwrite("check_agreement", &Config::check_agreement)
      .def_readwrite("cost_model", &Config::cost_model)
      .def_readwrite("ring_order", &Config::ring_order)
      .def_readwrite("slot_stores", &Config::slot_stores)
      .def_readwrite("plan_cache_entries", &Config::plan_cache_entries)
      .def_readwrite("autotune", &Config::autotune)
      .def_property(
          "spin_us", [](const Config& c) { return std::chrono::duration<double, std::micro>(c.wait.spin).count(); },
          [](Config& c, double us) {
            c.wait.spin = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(us));
          })
      .def_property(
          "yield_us", [](const Config& c) { return std::chrono::duration<double, std::micro>(c.wait.yield).count(); },
          [](Config& c, double us) {
            c.wait.yield = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(us));
          });

  m.def("check_algo", [](const std::string& text) { parse_algo_choice(text); }, py::arg("text"),
        "ValueError unless `text` is a valid RINGCOMM_ALGO / init(algo=) setting.");
  m.def("valid_segment_name", &Segment::valid_name, py::arg("name"));
  m.def("unlink_segment_name", &Segment::unlink_name, py::arg("name"),
        "Removes an orphaned shared segment name (only names of ringcomm's form).");
  m.def("sweep_segments", &Segment::sweep_orphans,
        "Removes this user's ringcomm segments whose owner process is gone; returns how many.");


  m.attr("ANY_SOURCE") = kAnySource;

  using C = Communicator;
  py::class_<C>(m, "Communicator")
      .def(py::init<int, int, Config>(), py::arg("rank"), py::arg("world_size"), py::arg("config"))
      .def_property_readonly("rank", &C::rank)
      .def_property_readonly("world_size", &C::world)
      .def_property_readonly("closed", &C::closed)
      .def("create_segment", &C::create_segment, py::arg("members"))
      .def("segment_name", &C::segment_name)
      .def("connect", [](C& c, const std::vector<std::string>& names) { without_gil([&] { c.connect(names); }); })
      .def("unlink_segment", &C::unlink_segment)
      .def("finish_init", &C::finish_init)
      .def("set_ring_order", &C::set_ring_order, py::arg("order"))
      .def_property_readonly("ring_order", &C::ring_order)
      .def("in_flight", &C::in_flight)
      .def("listen_tcp", &C::listen_tcp, py::arg("host"))
      .def("connect_tcp",
           [](C& c, const std::vector<std::string>& hosts, const std::vector<int>& ports, py::bytes secret) {
             std::string s = secret;
             without_gil([&] { c.connect_tcp(hosts, ports, s); });
           },
           py::arg("hosts"), py::arg("ports"), py::arg("secret"))
      .def("transport_of", &C::transport_of, py::arg("peer"))
      .def("tcp_frames_read", &C::tcp_frames_read)
      .def("tcp_frames_in_place", &C::tcp_frames_in_place)
      .def("slot_read_cost_updates", &C::slot_read_cost_updates, py::arg("peer"))
      .def("probe_pull", &C::probe_pull)
      .def("set_pull", &C::set_pull)
      .def("set_wait", [](C& c, double spin_us, double yield_us) {
        WaitPolicy w;
        w.spin = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(spin_us));
        w.yield = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(yield_us));
        c.set_wait_policy(w);
      })
      .def_property_readonly("pull_enabled", &C::pull_enabled)
      .def("error", &C::error)
      .def("close", [](C& c) { without_gil([&] { c.close(); }); })
      .def("abort", [](C& c, const std::string& why) { without_gil([&] { c.abort(why); }); })
      .def("revoke", [](C& c, const std::string& why) { without_gil([&] { c.revoke(why); }); })
      .def("peer_gone", [](C& c, int peer) { return without_gil([&] { return c.peer_gone(peer); }); })
      .def("reduce_scatter", [](py::handle self, py::handle out, py::handle in, int op, bool async) {
        C& c = self.cast<C&>();
        Buffer o = buffer_from_python(out, "output", true), i = buffer_from_python(in, "input", false);
        std::shared_ptr<Work> w = without_gil([&] { return c.reduce_scatter(o, i, to_op(op), async); });
        return make_work(std::move(w), self.ptr(), out.ptr(), in.ptr());
      })
      .def("all_gather", [](py::handle self, py::handle out, py::handle in, bool async) {
        C& c = self.cast<C&>();
        Buffer o = buffer_from_python(out, "output", true), i = buffer_from_python(in, "input", false);
        std::shared_ptr<Work> w = without_gil([&] { return c.all_gather(o, i, async); });
        return make_work(std::move(w), self.ptr(), out.ptr(), in.ptr());
      })
      .def("broadcast", [](py::handle self, py::handle x, int src, bool async) {
        C& c = self.cast<C&>();
        Buffer b = buffer_from_python(x, "tensor", true);
        std::shared_ptr<Work> w = without_gil([&] { return c.broadcast(b, src, async); });
        return make_work(std::move(w), self.ptr(), x.ptr());
      })
      .def("reduce", [](py::handle self, py::handle x, int dst, int op, bool async) {
        C& c = self.cast<C&>();
        Buffer b = buffer_from_python(x, "tensor", true);
        std::shared_ptr<Work> w = without_gil([&] { return c.reduce(b, dst, to_op(op), async); });
        return make_work(std::move(w), self.ptr(), x.ptr());
      })
      .def("scatter", [](py::handle self, py::handle out, py::handle in, int src, bool async) {
        C& c = self.cast<C&>();
        Buffer o = buffer_from_python(out, "output", true);
        Buffer i = c.rank() == src ? buffer_from_python(in, "input", false, true) : Buffer{};
        std::shared_ptr<Work> w = without_gil([&] { return c.scatter(o, i, src, async); });
        return make_work(std::move(w), self.ptr(), out.ptr(), in.ptr());
      })
      .def("gather", [](py::handle self, py::handle out, py::handle in, int dst, bool async) {
        C& c = self.cast<C&>();
        Buffer o = c.rank() == dst ? buffer_from_python(out, "output", true, true) : Buffer{};
        Buffer i = buffer_from_python(in, "input", false);
        std::shared_ptr<Work> w = without_gil([&] { return c.gather(o, i, dst, async); });
        return make_work(std::move(w), self.ptr(), out.ptr(), in.ptr());
      })
      .def("all_to_all", [](py::handle self, py::handle out, py::handle in, bool async) {
        C& c = self.cast<C&>();
        Buffer o = buffer_from_python(out, "output", true), i = buffer_from_python(in, "input", false);
        std::shared_ptr<Work> w = without_gil([&] { return c.all_to_all(o, i, async); });
        return make_work(std::move(w), self.ptr(), out.ptr(), in.ptr());
      })
      // send and recv are bound in bind_fast_calls.cpp.
      .def("sendrecv", [](C& c, py::handle send, int dst, py::handle recv, int src) {
        Buffer s = buffer_from_python(send, "send_tensor", false);
        Buffer r = buffer_from_python(recv, "recv_tensor", true);
        without_gil([&] { c.sendrecv(s, dst, r, src); });
      })
      .def("barrier", [](py::handle self, bool async) {
        C& c = self.cast<C&>();
        std::shared_ptr<Work> w = without_gil([&] { return c.barrier(async); });
        return make_work(std::move(w), self.ptr(), nullptr);
      });
}

}  // namespace ringcomm
