// Test hook: the rule by which a shared-memory writer chooses how to store its
// slots (transport/shm/slot_stores.h), driven with made-up costs.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>

#include "testing/bind_testing.h"
#include "transport/shm/slot_stores.h"

namespace py = pybind11;

namespace ringcomm {

void bind_slot_stores(py::module_& m) {
  m.def(
      "_slot_store_choice",
      [](bool streaming, std::array<double, 2> write_cost, std::array<double, 2> read_cost) {
        return SlotStoreRule::choose(streaming, write_cost.data(), read_cost.data());
      },
      py::arg("streaming"), py::arg("write_cost"), py::arg("read_cost"));
  m.def(
      "_slot_cost_average",
      [](double avg, double sample) {
        SlotStoreRule::average(&avg, sample);
        return avg;
      },
      py::arg("avg"), py::arg("sample"));
  m.def("_slot_cost_from_bits", &SlotStoreRule::cost_from_bits, py::arg("bits"));
  m.def("_slot_stores_mode", [](const std::string& name) { return static_cast<int>(parse_slot_stores(name)); },
        py::arg("name"));
}

}  // namespace ringcomm
