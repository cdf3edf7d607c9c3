// The reduction kernels compiled with -mavx2 -mfma -mf16c (see
// csrc/CMakeLists.txt); dispatch.cpp uses this table only on CPUs that have
// all three. Keep this file to the kernels: any other inline code instantiated
// here would be AVX2 code that the linker may share with the rest of the core.
#if defined(__x86_64__) || defined(__i386__)

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "reduce_avx2.cpp must be compiled with -mavx2 -mfma -mf16c"
#endif

#include "reduce/cpu/kernels.h"

namespace ringcomm::cpu {

const KernelTable& avx2_kernels() {
  static constexpr KernelTable kTable = make_kernel_table("avx2");
  return kTable;
}

}  // namespace ringcomm::cpu

#endif  // x86
