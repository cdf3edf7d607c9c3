// A caller's buffer as the core sees it: pointer, element count, dtype.
// The bindings fill it from numpy / torch / DLPack objects; the core never
// learns which framework a buffer came from.
#pragma once

#include <cstddef>

#include "ringcomm/types.h"

namespace ringcomm {

struct Buffer {
  char* ptr = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  bool present = false;  // false for an argument passed as None
  size_t nbytes() const { return count * dtype_size(dtype); }
};

}  // namespace ringcomm
