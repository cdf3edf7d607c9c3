// CUDA element-wise reduction and AVG-division kernels (see kernels.h). The
// value traits and op functors mirror reduce/cpu/kernels.h so that a GPU ring
// gives the same bits as the CPU path: half types load to float32, combine and
// round once to nearest even; integer SUM/PROD wrap; MIN/MAX propagate NaN.
//
// One grid-stride kernel template per element functor. Each thread moves 16
// bytes per load/store when dst, a and b share their offset modulo 16 (the few
// elements before the first 16-byte boundary and the tail go element by
// element); otherwise every element goes the scalar way. To keep compile time
// down, kernels are shared where the bits are the same: signed and unsigned
// SUM/PROD of one width, and the bitwise ops of every integer type (byte-wise).
#include "reduce/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace ringcomm::cuda {

namespace {

constexpr int kThreads = 256;
// Blocks per SM for the grid cap: 8 x 256 threads fills an SM (2048 threads).
constexpr int kBlocksPerSm = 8;
constexpr size_t kVecBytes = 16;

// ---- value traits: Storage in memory, Compute in registers -----------------

template <class S, class C = S>
struct Plain {
  using Storage = S;
  using Compute = C;
  __device__ static C load(S x) { return static_cast<C>(x); }
  __device__ static S store(C x) { return static_cast<S>(x); }
};

// Integer SUM/PROD wrap around; unsigned arithmetic makes that defined. The
// bits are the same for the signed type, so both share this instantiation.
template <class S>
using Wrapping = Plain<std::make_unsigned_t<S>>;

// bool is one byte holding 0 or 1; loading normalises any other byte to 1.
struct Bool {
  using Storage = uint8_t;
  using Compute = uint8_t;
  __device__ static uint8_t load(uint8_t x) { return x != 0; }
  __device__ static uint8_t store(uint8_t x) { return x; }
};

struct Float16 {
  using Storage = uint16_t;
  using Compute = float;
  __device__ static float load(uint16_t x) { return __half2float(__ushort_as_half(x)); }
  __device__ static uint16_t store(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

struct BFloat16 {
  using Storage = uint16_t;
  using Compute = float;
  __device__ static float load(uint16_t x) { return __bfloat162float(__ushort_as_bfloat16(x)); }
  __device__ static uint16_t store(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};

// ---- ops (same expressions as the CPU functors) -----------------------------

template <class C>
__device__ bool is_nan(C x) {
  if constexpr (std::is_floating_point_v<C>) {
    return x != x;
  } else {
    return false;
  }
}

struct Add {
  template <class C>
  __device__ static C apply(C a, C b) { return static_cast<C>(a + b); }
};
struct Mul {
  template <class C>
  __device__ static C apply(C a, C b) { return static_cast<C>(a * b); }
};
// NaN propagates from either side, as in numpy.minimum; otherwise a < b ? a : b,
// which also fixes which zero MIN(-0, +0) returns (b), as on the CPU.
struct Min {
  template <class C>
  __device__ static C apply(C a, C b) {
    return (is_nan(a) || is_nan(b)) ? static_cast<C>(a + b) : (a < b ? a : b);
  }
};
struct Max {
  template <class C>
  __device__ static C apply(C a, C b) {
    return (is_nan(a) || is_nan(b)) ? static_cast<C>(a + b) : (a > b ? a : b);
  }
};
struct And {
  template <class C>
  __device__ static C apply(C a, C b) { return static_cast<C>(a & b); }
};
struct Or {
  template <class C>
  __device__ static C apply(C a, C b) { return static_cast<C>(a | b); }
};
struct Xor {
  template <class C>
  __device__ static C apply(C a, C b) { return static_cast<C>(a ^ b); }
};

// ---- element functors: what the kernel applies ------------------------------
// Storage: element type in memory. kBinary: whether b is read (divide is
// unary). kWordwise: the op is the same on any grouping of bits, so a 16-byte
// vector is combined as four 32-bit words.

template <class T, class Op>
struct Combine {
  using Storage = typename T::Storage;
  static constexpr bool kBinary = true;
  static constexpr bool kWordwise = false;
  __device__ Storage operator()(Storage a, Storage b) const {
    return T::store(Op::apply(T::load(a), T::load(b)));
  }
};

// Bitwise ops on integers: byte-wise, whatever the integer type.
template <class Op>
struct Bytewise {
  using Storage = uint8_t;
  static constexpr bool kBinary = true;
  static constexpr bool kWordwise = true;
  __device__ uint8_t operator()(uint8_t a, uint8_t b) const { return Op::apply(a, b); }
  __device__ uint32_t word(uint32_t a, uint32_t b) const { return Op::apply(a, b); }
};

// AVG for floating types: one IEEE division in the compute type (__fdiv_rn is
// correctly rounded whatever -prec-div says), one rounding to storage.
template <class T>
struct DivideFloating {
  using Storage = typename T::Storage;
  using Compute = typename T::Compute;
  static constexpr bool kBinary = false;
  static constexpr bool kWordwise = false;
  Compute divisor;
  __device__ Storage operator()(Storage a, Storage) const {
    if constexpr (std::is_same_v<Compute, float>) {
      return T::store(__fdiv_rn(T::load(a), divisor));
    } else {
      return T::store(__ddiv_rn(T::load(a), divisor));
    }
  }
};

// AVG for integers: C++ division, which truncates toward zero (divisor >= 1).
// 8-bit values divide as int, wider ones in their own type.
template <class S>
struct DivideInteger {
  using Storage = S;
  using Quotient = std::conditional_t<(sizeof(S) >= 4), S, int>;
  static constexpr bool kBinary = false;
  static constexpr bool kWordwise = false;
  Quotient divisor;
  __device__ S operator()(S a, S) const {
    return static_cast<S>(static_cast<Quotient>(a) / divisor);
  }
};

// ---- the kernel ------------------------------------------------------------------

template <class F>
__device__ uint4 apply_vector(const F& f, const uint4& a, const uint4& b) {
  if constexpr (F::kWordwise) {
    return make_uint4(f.word(a.x, b.x), f.word(a.y, b.y), f.word(a.z, b.z), f.word(a.w, b.w));
  } else {
    using S = typename F::Storage;
    constexpr int kLanes = kVecBytes / sizeof(S);
    S x[kLanes], y[kLanes], r[kLanes];
    memcpy(x, &a, kVecBytes);
    memcpy(y, &b, kVecBytes);
#pragma unroll
    for (int j = 0; j < kLanes; ++j) r[j] = f(x[j], y[j]);
    uint4 out;
    memcpy(&out, r, kVecBytes);
    return out;
  }
}

// Elements [0, head) and [head + nvec * lanes, n) go one by one; the nvec
// 16-byte vectors in between (16-byte aligned in all three arrays) go whole.
// No __restrict__: dst may be x or y. Every element is read and then written by
// the same thread and by no other, so in-place needs no ordering.
template <class F>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    elementwise_kernel(typename F::Storage* d, const typename F::Storage* x,
                       const typename F::Storage* y, size_t n, size_t head, size_t nvec, F f) {
  using S = typename F::Storage;
  constexpr size_t kLanes = kVecBytes / sizeof(S);
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;

  uint4* vd = reinterpret_cast<uint4*>(d + head);
  const uint4* vx = reinterpret_cast<const uint4*>(x + head);
  const uint4* vy = reinterpret_cast<const uint4*>(y + head);
  for (size_t i = first; i < nvec; i += stride) {
    const uint4 a = vx[i];
    if constexpr (F::kBinary) {
      vd[i] = apply_vector(f, a, vy[i]);
    } else {
      vd[i] = apply_vector(f, a, a);
    }
  }

  const size_t tail = head + nvec * kLanes;
  const size_t scalar = head + (n - tail);
  for (size_t i = first; i < scalar; i += stride) {
    const size_t j = i < head ? i : tail + (i - head);
    const S a = x[j];
    if constexpr (F::kBinary) {
      d[j] = f(a, y[j]);
    } else {
      d[j] = f(a, a);
    }
  }
}

// ---- launching ------------------------------------------------------------------

[[noreturn]] void throw_cuda(const char* what, cudaError_t err) {
  throw Error(std::string("ringcomm::cuda::") + what + ": " + cudaGetErrorString(err));
}

// Grid cap: kBlocksPerSm blocks per SM of the current device, queried once
// per device at the first call (never at load time).
int max_blocks(const char* what) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cache[kMaxCachedDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) throw_cuda(what, err);
  const bool cached = dev >= 0 && dev < kMaxCachedDevices;
  if (cached) {
    const int v = cache[dev].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) throw_cuda(what, err);
  const int v = std::max(sms, 1) * kBlocksPerSm;
  if (cached) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

template <class F>
void launch(const char* what, void* dst, const void* a, const void* b, size_t n, F f,
            cudaStream_t stream) {
  using S = typename F::Storage;
  constexpr size_t kLanes = kVecBytes / sizeof(S);
  const uintptr_t pd = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a);
  const uintptr_t pb = reinterpret_cast<uintptr_t>(b);
  size_t head = n;
  size_t nvec = 0;
  if (pd % kVecBytes == pa % kVecBytes && pd % kVecBytes == pb % kVecBytes) {
    // The callers checked element alignment, so this is a whole number of elements.
    head = std::min(n, ((kVecBytes - pd % kVecBytes) % kVecBytes) / sizeof(S));
    nvec = (n - head) / kLanes;
  }
  const size_t work = std::max(nvec, n - nvec * kLanes);
  const size_t wanted = (work + kThreads - 1) / kThreads;
  const int blocks =
      static_cast<int>(std::min(wanted, static_cast<size_t>(max_blocks(what))));
  // A stale error from an earlier runtime call on this thread (cudaEventQuery's
  // "not ready" among them) would otherwise be reported as this launch's.
  (void)cudaGetLastError();
  elementwise_kernel<F><<<blocks, kThreads, 0, stream>>>(
      static_cast<S*>(dst), static_cast<const S*>(a), static_cast<const S*>(b), n, head, nvec,
      f);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda(what, err);
}

void check_codes(DataType dtype, ReduceOp op) {
  if (static_cast<int>(dtype) >= kNumDataTypes) {
    throw ValueError("invalid dtype code " + std::to_string(static_cast<int>(dtype)));
  }
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw ValueError("invalid reduce op code " + std::to_string(static_cast<int>(op)));
  }
}

void check_aligned(const char* what, DataType dtype, const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(dtype) != 0) {
    throw ValueError(std::string("ringcomm::cuda::") + what + ": " + dtype_name(dtype) +
                     " pointer is not aligned to its element size");
  }
}

// SUM (and AVG), PROD through Arith; MIN, MAX through Ordered.
template <class Arith, class Ordered>
void reduce_arithmetic(ReduceOp op, void* dst, const void* a, const void* b, size_t n,
                       cudaStream_t stream) {
  constexpr const char* kWhat = "reduce";
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return launch(kWhat, dst, a, b, n, Combine<Arith, Add>{}, stream);
    case ReduceOp::kProd:
      return launch(kWhat, dst, a, b, n, Combine<Arith, Mul>{}, stream);
    case ReduceOp::kMin:
      return launch(kWhat, dst, a, b, n, Combine<Ordered, Min>{}, stream);
    case ReduceOp::kMax:
      return launch(kWhat, dst, a, b, n, Combine<Ordered, Max>{}, stream);
    default:
      break;
  }
  throw ValueError(std::string("reduce op ") + reduce_op_name(op) + " has no CUDA kernel");
}

template <class S>
void reduce_integer(ReduceOp op, void* dst, const void* a, const void* b, size_t n,
                    cudaStream_t stream) {
  constexpr const char* kWhat = "reduce";
  const size_t bytes = n * sizeof(S);
  switch (op) {
    case ReduceOp::kBand:
      return launch(kWhat, dst, a, b, bytes, Bytewise<And>{}, stream);
    case ReduceOp::kBor:
      return launch(kWhat, dst, a, b, bytes, Bytewise<Or>{}, stream);
    case ReduceOp::kBxor:
      return launch(kWhat, dst, a, b, bytes, Bytewise<Xor>{}, stream);
    default:
      return reduce_arithmetic<Wrapping<S>, Plain<S>>(op, dst, a, b, n, stream);
  }
}

}  // namespace

void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n,
            cudaStream_t stream) {
  check_codes(dtype, op);
  if (!reduce_op_supported(dtype, op)) {
    throw ValueError(std::string("reduce op ") + reduce_op_name(op) + " is not defined for " +
                     dtype_name(dtype));
  }
  if (n == 0) return;
  check_aligned("reduce", dtype, dst);
  check_aligned("reduce", dtype, a);
  check_aligned("reduce", dtype, b);
  switch (dtype) {
    case DataType::kFloat16:
      return reduce_arithmetic<Float16, Float16>(op, dst, a, b, n, stream);
    case DataType::kBFloat16:
      return reduce_arithmetic<BFloat16, BFloat16>(op, dst, a, b, n, stream);
    case DataType::kFloat32:
      return reduce_arithmetic<Plain<float>, Plain<float>>(op, dst, a, b, n, stream);
    case DataType::kFloat64:
      return reduce_arithmetic<Plain<double>, Plain<double>>(op, dst, a, b, n, stream);
    case DataType::kInt8:
      return reduce_integer<int8_t>(op, dst, a, b, n, stream);
    case DataType::kUInt8:
      return reduce_integer<uint8_t>(op, dst, a, b, n, stream);
    case DataType::kInt32:
      return reduce_integer<int32_t>(op, dst, a, b, n, stream);
    case DataType::kInt64:
      return reduce_integer<int64_t>(op, dst, a, b, n, stream);
    case DataType::kBool:
      // MIN is logical and, MAX logical or; BAND / BOR are the same on 0 / 1.
      if (op == ReduceOp::kMin || op == ReduceOp::kBand) {
        return launch("reduce", dst, a, b, n, Combine<Bool, And>{}, stream);
      }
      return launch("reduce", dst, a, b, n, Combine<Bool, Or>{}, stream);
  }
}

void divide(DataType dtype, void* buf, size_t n, int divisor, cudaStream_t stream) {
  check_codes(dtype, ReduceOp::kAvg);
  if (!reduce_op_supported(dtype, ReduceOp::kAvg)) {
    throw ValueError(std::string("reduce op avg is not defined for ") + dtype_name(dtype));
  }
  if (divisor < 1) {
    throw ValueError("ringcomm::cuda::divide: divisor must be >= 1, got " +
                     std::to_string(divisor));
  }
  if (n == 0) return;
  check_aligned("divide", dtype, buf);
  constexpr const char* kWhat = "divide";
  switch (dtype) {
    case DataType::kFloat16:
      return launch(kWhat, buf, buf, buf, n, DivideFloating<Float16>{static_cast<float>(divisor)},
                    stream);
    case DataType::kBFloat16:
      return launch(kWhat, buf, buf, buf, n,
                    DivideFloating<BFloat16>{static_cast<float>(divisor)}, stream);
    case DataType::kFloat32:
      return launch(kWhat, buf, buf, buf, n,
                    DivideFloating<Plain<float>>{static_cast<float>(divisor)}, stream);
    case DataType::kFloat64:
      return launch(kWhat, buf, buf, buf, n,
                    DivideFloating<Plain<double>>{static_cast<double>(divisor)}, stream);
    case DataType::kInt8:
      return launch(kWhat, buf, buf, buf, n, DivideInteger<int8_t>{divisor}, stream);
    case DataType::kUInt8:
      return launch(kWhat, buf, buf, buf, n, DivideInteger<uint8_t>{divisor}, stream);
    case DataType::kInt32:
      return launch(kWhat, buf, buf, buf, n, DivideInteger<int32_t>{divisor}, stream);
    case DataType::kInt64:
      return launch(kWhat, buf, buf, buf, n, DivideInteger<int64_t>{divisor}, stream);
    case DataType::kBool:
      break;
  }
  throw ValueError(std::string("reduce op avg is not defined for ") + dtype_name(dtype));
}

}  // namespace ringcomm::cuda
