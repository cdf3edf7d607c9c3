// Picks the widest kernel table this CPU runs, once per process, and hands out
// reducers from it.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <cstring>
#include <string>

#include "reduce/cpu/kernels.h"
#include "ringcomm/reducer.h"

namespace ringcomm {

namespace {

bool cpu_has_avx2_fma_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for
  // __builtin_cpu_supports, and fuzz/ builds this file with clang. The AVX2
  // check above it already covers the OS saving the vector registers.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

const cpu::KernelTable& select_kernels() {
  // RINGCOMM_REDUCE_ISA=baseline forces the portable kernels, so tests can
  // check both tables on one machine.
  const char* forced = std::getenv("RINGCOMM_REDUCE_ISA");
  const bool want_baseline = forced != nullptr && std::strcmp(forced, "baseline") == 0;
#if defined(__x86_64__) || defined(__i386__)
  if (!want_baseline && cpu_has_avx2_fma_f16c()) return cpu::avx2_kernels();
#else
  (void)want_baseline;
#endif
  return cpu::baseline_kernels();
}

const cpu::KernelTable& kernels() {
  static const cpu::KernelTable& table = select_kernels();
  return table;
}

}  // namespace

Reducer make_reducer(DataType dtype, ReduceOp op) {
  if (static_cast<int>(dtype) >= kNumDataTypes) {
    throw ValueError("invalid dtype code " + std::to_string(static_cast<int>(dtype)));
  }
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw ValueError("invalid reduce op code " + std::to_string(static_cast<int>(op)));
  }
  if (!reduce_op_supported(dtype, op)) {
    throw ValueError(std::string("reduce op ") + reduce_op_name(op) + " is not defined for " +
                     dtype_name(dtype));
  }
  const cpu::KernelTable& table = kernels();
  const int t = static_cast<int>(dtype);
  Reducer r;
  r.dtype = dtype;
  r.op = op;
  r.elem_size = dtype_size(dtype);
  r.fn = table.reduce[t][static_cast<int>(op)];
  r.divide = op == ReduceOp::kAvg ? table.divide[t] : nullptr;
  return r;
}

const char* reducer_isa() { return kernels().isa; }

}  // namespace ringcomm
