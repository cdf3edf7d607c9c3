// Element-wise reduction kernels, written once as small templates and compiled
// once per instruction set: reduce_base.cpp (baseline) and reduce_avx2.cpp
// (-mavx2 -mfma -mf16c) each include this header and build their own table of
// function pointers; dispatch.cpp picks one table per process.
//
// The loops are plain scalar code shaped so that GCC vectorises them: one
// "value traits" type per dtype says how an element is loaded into its compute
// type and stored back, one functor per op says how two compute values combine.
// Keep them branch-free: a conditional becomes a vector blend, a branch stops
// the vectoriser. The one exception is float16/bfloat16 in the AVX2 build,
// which converts with intrinsics (HalfVectors) because GCC's own code for them
// is scalar or slow; the ops stay the same functors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define RINGCOMM_HAVE_HALF_VECTORS 1
#else
#define RINGCOMM_HAVE_HALF_VECTORS 0
#endif

#include "ringcomm/reducer.h"

#if defined(__GNUC__) && !defined(__clang__)
#define RINGCOMM_IVDEP _Pragma("GCC ivdep")
#else
#define RINGCOMM_IVDEP
#endif

namespace ringcomm::cpu {

// One instruction set's kernels, indexed by the DataType and ReduceOp values.
struct KernelTable {
  const char* isa;
  ReduceFn reduce[kNumDataTypes][kNumReduceOps];  // null where unsupported; AVG holds SUM
  DivideFn divide[kNumDataTypes];                 // null where AVG is unsupported
};

const KernelTable& baseline_kernels();
#if defined(__x86_64__) || defined(__i386__)
const KernelTable& avx2_kernels();
#endif

// Everything below has internal linkage on purpose. The same templates are
// instantiated in two translation units compiled with different -m flags; with
// external linkage the linker would keep one copy of each instantiation for
// both tables, and AVX2 code could end up in the baseline table.
namespace {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// c ? a : b as mask arithmetic: GCC turns a nested ?: over values computed
// with float instructions into branches, which stops the vectoriser.
inline uint32_t select(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// ---- value traits: Storage in memory, Compute in registers -----------------

template <class S, class C = S>
struct Plain {
  using Storage = S;
  using Compute = C;
  static C load(S x) { return static_cast<C>(x); }
  static S store(C x) { return static_cast<S>(x); }
};

// Integer SUM/PROD wrap around like numpy; unsigned arithmetic makes that
// defined behaviour (signed overflow is UB and lets GCC assume it away).
template <class S>
using Wrapping = Plain<S, std::make_unsigned_t<S>>;

// bool is one byte holding 0 or 1; loading normalises any other byte to 1.
struct Bool {
  using Storage = uint8_t;
  using Compute = uint8_t;
  static uint8_t load(uint8_t x) { return x != 0; }
  static uint8_t store(uint8_t x) { return x; }
};

// bfloat16: the top half of a float32.
struct BFloat16 {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t x) { return bits_to_float(uint32_t{x} << 16); }
  static uint16_t store(float f) {
    const uint32_t bits = float_to_bits(f);
    // NaN becomes the quiet NaN 0x7fc0 (which the rounding below keeps).
    const uint32_t u = select((bits & 0x7fffffffu) > 0x7f800000u, 0x7fc00000u, bits);
    // Round to nearest even: add 0x7fff plus the lowest kept bit, truncate.
    // Overflow carries into the exponent and yields inf, as it should.
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

// IEEE float16 in software, bit-exact with F16C / _Float16 conversions except
// NaN payloads (every NaN stores as 0x7e00 / 0xfe00). Branch-free so that it
// vectorises with plain SSE2 or NEON integer ops; the AVX2 build uses
// vcvtph2ps / vcvtps2ph instead (see HalfVectors below).
struct Float16 {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t h) {
    const uint32_t em = uint32_t{h & 0x7fffu} << 13;  // exponent+mantissa, float position
    const uint32_t exp = em & (0x7c00u << 13);
    const uint32_t normal = em + ((127u - 15u) << 23);  // rebias the exponent
    const uint32_t inf_nan = em + ((255u - 31u) << 23);
    // Subnormal or zero: 2^-14 * (1 + m/1024) - 2^-14 = m * 2^-24, exactly.
    const uint32_t subnormal =
        float_to_bits(bits_to_float(em + (113u << 23)) - bits_to_float(113u << 23));
    const uint32_t mag =
        select(exp == (0x7c00u << 13), inf_nan, select(exp == 0, subnormal, normal));
    return bits_to_float(mag | (uint32_t{h & 0x8000u} << 16));
  }
  static uint16_t store(float f) {
    const uint32_t all = float_to_bits(f);
    const uint32_t sign = all & 0x80000000u;
    const uint32_t u = all ^ sign;
    const uint32_t inf_nan = select(u > 0x7f800000u, 0x7e00u, 0x7c00u);
    // Below 2^-14 the result is subnormal: adding 0.5 (whose ulp is 2^-24, the
    // float16 subnormal step) lets the FPU round to nearest even for us.
    const uint32_t kHalf = 126u << 23;
    const uint32_t subnormal = float_to_bits(bits_to_float(u) + bits_to_float(kHalf)) - kHalf;
    // Normal: rebias, round to nearest even on the 13 dropped bits. A carry
    // out of the mantissa bumps the exponent (65520 and up become inf).
    const uint32_t odd = (u >> 13) & 1u;
    const uint32_t normal = (u - ((127u - 15u) << 23) + 0xfffu + odd) >> 13;
    const uint32_t mag =
        select(u >= (143u << 23), inf_nan, select(u < (113u << 23), subnormal, normal));
    return static_cast<uint16_t>(mag | (sign >> 16));
  }
};

// ---- ops -------------------------------------------------------------------
// Written as templates on the compute type so the half-precision AVX2 path can
// apply them to whole __m256 vectors (GCC vector extensions support +, *, <
// and ?:).

struct Add {
  template <class C>
  static C apply(C a, C b) { return static_cast<C>(a + b); }
};
struct Mul {
  template <class C>
  static C apply(C a, C b) { return static_cast<C>(a * b); }
};
// NaN propagates from either side, as in numpy.minimum / torch.minimum
// (NaN + x is NaN; for integers x != x is false and this is a plain min / max).
struct Min {
  template <class C>
  static C apply(C a, C b) { return (a != a || b != b) ? static_cast<C>(a + b) : (a < b ? a : b); }
};
struct Max {
  template <class C>
  static C apply(C a, C b) { return (a != a || b != b) ? static_cast<C>(a + b) : (a > b ? a : b); }
};
struct And {
  template <class C>
  static C apply(C a, C b) { return static_cast<C>(a & b); }
};
struct Or {
  template <class C>
  static C apply(C a, C b) { return static_cast<C>(a | b); }
};
struct Xor {
  template <class C>
  static C apply(C a, C b) { return static_cast<C>(a ^ b); }
};

// ---- half precision with AVX2 + F16C ----------------------------------------
// GCC 12 does not vectorise _Float16 <-> float conversions at all, and its
// vectorised BFloat16 traits above run at half the memory bandwidth (widening
// and narrowing shuffles). Here sixteen halves at a time become two __m256 of
// float32, computed on, and stored back.
#if RINGCOMM_HAVE_HALF_VECTORS

template <class T>
struct HalfVectors;

template <>
struct HalfVectors<Float16> {
  static void load(const uint16_t* p, __m256& lo, __m256& hi) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
  static void store(uint16_t* p, __m256 lo, __m256 hi) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8),
                     _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT));
  }
};

// Interleaving with zeros puts each bfloat16 in the top half of a 32-bit lane,
// which is its float32 value; the element order within (lo, hi) is permuted
// (per 128-bit lane), which element-wise ops do not mind, and the pack in
// store() undoes it.
template <>
struct HalfVectors<BFloat16> {
  static void load(const uint16_t* p, __m256& lo, __m256& hi) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
    hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
  }
  // Same rounding as BFloat16::store: NaN becomes 0x7fc0, the rest round to
  // nearest even. Returns the result in the low 16 bits of each lane.
  static __m256i round(__m256 f) {
    const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    const __m256i u = _mm256_castps_si256(
        _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
    return _mm256_srli_epi32(r, 16);
  }
  static void store(uint16_t* p, __m256 lo, __m256 hi) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(round(lo), round(hi)));
  }
};

// d[i] = f(x[i], y[i]) on float32 vectors. The tail goes through a zero-padded
// block so that every element is converted by the same instructions.
template <class T, class F>
void half_map(uint16_t* d, const uint16_t* x, const uint16_t* y, size_t n, F f) {
  using V = HalfVectors<T>;
  __m256 xl, xh, yl, yh;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V::load(x + i, xl, xh);
    V::load(y + i, yl, yh);
    V::store(d + i, f(xl, yl), f(xh, yh));
  }
  if (i < n) {
    uint16_t tx[16] = {}, ty[16] = {}, td[16];
    const size_t rest = (n - i) * sizeof(uint16_t);
    std::memcpy(tx, x + i, rest);
    std::memcpy(ty, y + i, rest);
    V::load(tx, xl, xh);
    V::load(ty, yl, yh);
    V::store(td, f(xl, yl), f(xh, yh));
    std::memcpy(d + i, td, rest);
  }
}

template <class T>
constexpr bool kIsHalf = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

#endif  // RINGCOMM_HAVE_HALF_VECTORS

// ---- kernels ---------------------------------------------------------------

template <class T, class Op>
void reduce_elementwise(void* dst, const void* a, const void* b, size_t n) {
  using S = typename T::Storage;
  S* d = static_cast<S*>(dst);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
#if RINGCOMM_HAVE_HALF_VECTORS
  if constexpr (kIsHalf<T>) {
    half_map<T>(d, x, y, n, [](__m256 p, __m256 q) { return Op::apply(p, q); });
    return;
  }
#endif
  // dst may be a or b exactly: element i is read before it is written and no
  // other iteration touches it, so there is no loop-carried dependence and no
  // runtime alias check is needed.
  RINGCOMM_IVDEP
  for (size_t i = 0; i < n; ++i) d[i] = T::store(Op::apply(T::load(x[i]), T::load(y[i])));
}

// AVG's final step for floating types: one division in the compute type, one
// rounding back to storage.
template <class T>
void divide_floating(void* buf, size_t n, int divisor) {
  using S = typename T::Storage;
  using C = typename T::Compute;
  S* p = static_cast<S*>(buf);
  const C d = static_cast<C>(divisor);
#if RINGCOMM_HAVE_HALF_VECTORS
  if constexpr (kIsHalf<T>) {
    const __m256 vd = _mm256_set1_ps(d);
    half_map<T>(p, p, p, n, [vd](__m256 v, __m256) { return v / vd; });
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) p[i] = T::store(T::load(p[i]) / d);
}

// Truncating integer division for AVG, divisor >= 1. For 8- and 32-bit types
// it goes through double, which vectorises where integer division cannot and
// is exact: a non-integer quotient x/d lies at least 1/d from the next integer,
// while double's rounding error is below (|x|/d + 1) * 2^-53, and
// (|x| + d) < 2^53. 64-bit values need the integer division.
template <class S>
void divide_integer(void* buf, size_t n, int divisor) {
  S* p = static_cast<S*>(buf);
  if constexpr (sizeof(S) <= 4) {
    const double d = divisor;
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<S>(static_cast<double>(p[i]) / d);
  } else {
    const S d = divisor;
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<S>(p[i] / d);
  }
}

// ---- the table ----------------------------------------------------------------

using ReduceRow = ReduceFn[kNumReduceOps];

constexpr int op_index(ReduceOp op) { return static_cast<int>(op); }

// SUM, PROD and AVG combine through Arith (wrapping for integers); MIN and MAX
// compare through Ordered.
template <class Arith, class Ordered>
constexpr void add_arithmetic(ReduceRow& row) {
  row[op_index(ReduceOp::kSum)] = &reduce_elementwise<Arith, Add>;
  row[op_index(ReduceOp::kProd)] = &reduce_elementwise<Arith, Mul>;
  row[op_index(ReduceOp::kMin)] = &reduce_elementwise<Ordered, Min>;
  row[op_index(ReduceOp::kMax)] = &reduce_elementwise<Ordered, Max>;
  row[op_index(ReduceOp::kAvg)] = &reduce_elementwise<Arith, Add>;
}

template <class T>
constexpr void add_bitwise(ReduceRow& row) {
  row[op_index(ReduceOp::kBand)] = &reduce_elementwise<T, And>;
  row[op_index(ReduceOp::kBor)] = &reduce_elementwise<T, Or>;
  row[op_index(ReduceOp::kBxor)] = &reduce_elementwise<T, Xor>;
}

template <class T>
constexpr void add_floating(KernelTable& t, DataType dt) {
  add_arithmetic<T, T>(t.reduce[static_cast<int>(dt)]);
  t.divide[static_cast<int>(dt)] = &divide_floating<T>;
}

template <class S>
constexpr void add_integer(KernelTable& t, DataType dt) {
  ReduceRow& row = t.reduce[static_cast<int>(dt)];
  add_arithmetic<Wrapping<S>, Plain<S>>(row);
  add_bitwise<Plain<S>>(row);
  t.divide[static_cast<int>(dt)] = &divide_integer<S>;
}

constexpr KernelTable make_kernel_table(const char* isa) {
  KernelTable t{};
  t.isa = isa;
  add_floating<Float16>(t, DataType::kFloat16);
  add_floating<BFloat16>(t, DataType::kBFloat16);
  add_floating<Plain<float>>(t, DataType::kFloat32);
  add_floating<Plain<double>>(t, DataType::kFloat64);
  add_integer<int8_t>(t, DataType::kInt8);
  add_integer<uint8_t>(t, DataType::kUInt8);
  add_integer<int32_t>(t, DataType::kInt32);
  add_integer<int64_t>(t, DataType::kInt64);
  // bool: MIN is logical and, MAX is logical or; no SUM, PROD or AVG.
  ReduceRow& flags = t.reduce[static_cast<int>(DataType::kBool)];
  flags[op_index(ReduceOp::kMin)] = &reduce_elementwise<Bool, And>;
  flags[op_index(ReduceOp::kMax)] = &reduce_elementwise<Bool, Or>;
  add_bitwise<Bool>(flags);
  return t;
}

}  // namespace
}  // namespace ringcomm::cpu
