// Test hook: the plan checker (testing/plan_check.h) over one call's schedules,
// all ranks in this process, no transport. Not part of the public API.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <tuple>

#include "bindings/bind.h"
#include "ringcomm/types.h"
#include "testing/plan_check.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

// Checks that index `i` names a step of `steps`.
void require_step(const Schedule& steps, size_t i, const char* hook) {
  if (i >= steps.size()) {
    throw ValueError(std::string("check_plan: ") + hook + ": no step " + std::to_string(i) + " (the rank has " +
                     std::to_string(steps.size()) + ")");
  }
}

}  // namespace

void bind_plan_check(py::module_& m) {
  m.def(
      "check_plan",
      [](const std::string& op, const std::string& algo, int world, size_t count, size_t elem_size, int root,
         bool avg, std::optional<std::vector<int>> ring, bool agreement, size_t slot_bytes, int nslots,
         size_t slice_elems, const std::string& executor, size_t chunk_bytes,
         std::optional<std::tuple<int, size_t>> drop, std::optional<std::tuple<int, size_t, size_t>> swap,
         std::optional<std::tuple<int, size_t, size_t>> resize, std::optional<std::tuple<int, size_t, long>> after,
         std::optional<std::vector<int>> hosts) {
        PlanCheckCall c;
        c.kind = collective_arg(op);
        c.algo = algo_arg(op, c.kind, algo);
        c.world = world;
        c.count = count;
        c.elem = elem_size;
        c.root = root;
        c.avg = avg;
        if (ring) c.ring = *ring;
        if (hosts) c.hosts = *hosts;
        c.agreement = agreement;
        c.slot_bytes = slot_bytes;
        c.nslots = nslots;
        c.slice_elems = slice_elems;
        if (executor != "cpu" && executor != "device") {
          throw ValueError("check_plan: executor must be 'cpu' or 'device', got '" + executor + "'");
        }
        c.device = executor == "device";
        c.chunk_bytes = chunk_bytes;
        // Breaking a plan on purpose: drop a step, swap two, change a step's
        // size, or what it waits for (after=(rank or -1 for every rank, i, j or -1 for nothing)).
        PlanTamper tamper = [&](int rank, Schedule& steps) {
          if (drop && std::get<0>(*drop) == rank) {
            require_step(steps, std::get<1>(*drop), "drop");
            steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(std::get<1>(*drop)));
          }
          if (swap && std::get<0>(*swap) == rank) {
            require_step(steps, std::get<1>(*swap), "swap");
            require_step(steps, std::get<2>(*swap), "swap");
            std::swap(steps[std::get<1>(*swap)], steps[std::get<2>(*swap)]);
          }
          if (resize && std::get<0>(*resize) == rank) {
            require_step(steps, std::get<1>(*resize), "resize");
            steps[std::get<1>(*resize)].nbytes = std::get<2>(*resize);
          }
          if (after && (std::get<0>(*after) == rank || std::get<0>(*after) == -1)) {
            require_step(steps, std::get<1>(*after), "after");
            const long j = std::get<2>(*after);
            steps[std::get<1>(*after)].after = j < 0 ? SIZE_MAX : static_cast<size_t>(j);
          }
        };
        PlanCheckResult r;
        {
          py::gil_scoped_release release;
          r = check_plan(c, tamper);
        }
        py::dict out;
        out["error"] = r.error;
        out["family"] = schedule_family_name(r.family);
        out["steps"] = r.steps;
        out["messages"] = r.messages;
        out["passes"] = r.passes;
        return out;
      },
      py::arg("op"), py::arg("algo") = "auto", py::arg("world") = 1, py::arg("count") = 0, py::arg("elem_size") = 4,
      py::arg("root") = -1, py::arg("avg") = false, py::arg("ring") = py::none(), py::arg("agreement") = false,
      py::arg("slot_bytes") = 128 * 1024, py::arg("nslots") = 16, py::arg("slice_elems") = 0,
      py::arg("executor") = "cpu", py::arg("chunk_bytes") = 128 * 1024, py::arg("drop") = py::none(),
      py::arg("swap") = py::none(), py::arg("resize") = py::none(), py::arg("after") = py::none(), py::arg("hosts") = py::none(),
      "Checks the schedules of one call on every rank (testing/plan_check.h): returns a dict with 'error' (empty "
      "when the plan is sound), 'family', 'steps', 'messages' and 'passes'. drop=(rank, i), swap=(rank, i, j), "
      "resize=(rank, i, nbytes) and after=(rank, i, j) break the plan on purpose. A test hook, not public API.");
}

}  // namespace ringcomm
