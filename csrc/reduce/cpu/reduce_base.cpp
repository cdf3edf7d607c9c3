// The reduction kernels compiled for the baseline instruction set of the
// target (SSE2 on x86-64, NEON on aarch64): the table every CPU can run.
#include "reduce/cpu/kernels.h"

namespace ringcomm::cpu {

const KernelTable& baseline_kernels() {
  static constexpr KernelTable kTable = make_kernel_table("baseline");
  return kTable;
}

}  // namespace ringcomm::cpu
