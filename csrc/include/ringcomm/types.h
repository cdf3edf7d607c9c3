// Data types, reduce operations and error types shared by every layer of the core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ringcomm {

// Values are part of the binding ABI (python/ringcomm/gpu_buffers.py _TORCH_DTYPES mirrors them).
enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,
};
constexpr int kNumDataTypes = 9;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,  // SUM followed by a division by the world size
  kBand = 5,
  kBor = 6,
  kBxor = 7,
};
constexpr int kNumReduceOps = 8;

// The size of one element (ValueError for a code that is no DataType).
[[noreturn]] void throw_invalid_dtype(DataType t);
inline size_t dtype_size(DataType t) {
  constexpr uint8_t kSizes[kNumDataTypes] = {2, 2, 4, 8, 1, 1, 4, 8, 1};  // in enum order
  const unsigned i = static_cast<unsigned>(t);
  if (i >= static_cast<unsigned>(kNumDataTypes)) throw_invalid_dtype(t);
  return kSizes[i];
}
const char* dtype_name(DataType t);
const char* reduce_op_name(ReduceOp op);
bool is_integer(DataType t);  // int8..int64 and bool
bool is_floating(DataType t);

// Whether `op` is defined on `t` (e.g. BAND only on integers, SUM not on bool).
bool reduce_op_supported(DataType t, ReduceOp op);

// Errors. Bindings map Error -> ringcomm.RingcommError, TimeoutError ->
// ringcomm.TimeoutError, ValueError/TypeError -> the Python builtins.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class TimeoutError : public Error {
 public:
  using Error::Error;
};
// Ranks called different collectives (op, dtype, count, root, split lists):
// ringcomm.CollectiveMismatchError, on every rank.
class MismatchError : public Error {
 public:
  using Error::Error;
};
// A blocking wait was interrupted by a signal (Ctrl-C): the Python exception
// the signal handler raised (KeyboardInterrupt) is pending and is what the
// bindings raise.
class Interrupted : public Error {
 public:
  using Error::Error;
};
// A peer is gone (died, closed, aborted); thrown by links, given its call's
// context by the executor.
class PeerLostError : public Error {
 public:
  using Error::Error;
};
// The communicator was revoked (Communicator::revoke on any rank):
// ringcomm.RevokedError. A revoke travels as an abort whose reason carries
// kRevokedMark, so every rank that hears of it, directly or through a peer
// that failed because of it, raises this type.
class RevokedError : public Error {
 public:
  using Error::Error;
};
constexpr const char* kRevokedMark = "revoked the communicator";
inline bool mentions_revoke(const std::string& text) { return text.find(kRevokedMark) != std::string::npos; }
class ValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};
class TypeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace ringcomm
