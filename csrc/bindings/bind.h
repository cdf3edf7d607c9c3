#pragma once

#include <pybind11/pybind11.h>

namespace ringcomm {

void bind_errors(pybind11::module_& m);
void bind_types(pybind11::module_& m);
void bind_communicator(pybind11::module_& m);

}  // namespace ringcomm
