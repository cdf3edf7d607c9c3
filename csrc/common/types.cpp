// Names, sizes and op/dtype compatibility for the enums in ringcomm/types.h.
#include "ringcomm/types.h"

namespace ringcomm {

namespace {

bool valid_dtype(DataType t) { return static_cast<int>(t) < kNumDataTypes; }
bool valid_op(ReduceOp op) { return static_cast<int>(op) < kNumReduceOps; }

}  // namespace

void throw_invalid_dtype(DataType t) {
  throw ValueError("invalid dtype code " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DataType t) {
  // Indexed by the enum value; used in error messages, so never throws.
  static const char* const kNames[kNumDataTypes] = {
      "float16", "bfloat16", "float32", "float64", "int8",
      "uint8",   "int32",    "int64",   "bool"};
  return valid_dtype(t) ? kNames[static_cast<int>(t)] : "unknown";
}

const char* reduce_op_name(ReduceOp op) {
  static const char* const kNames[kNumReduceOps] = {
      "sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  return valid_op(op) ? kNames[static_cast<int>(op)] : "unknown";
}

bool is_integer(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kBool:
      return true;
    default:
      return false;
  }
}

bool is_floating(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
      return true;
    default:
      return false;
  }
}

bool reduce_op_supported(DataType t, ReduceOp op) {
  if (!valid_dtype(t) || !valid_op(op)) return false;
  const bool is_bool = t == DataType::kBool;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kProd:
    case ReduceOp::kAvg:
      return !is_bool;
    case ReduceOp::kMin:  // logical and on bool
    case ReduceOp::kMax:  // logical or on bool
      return true;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
      return is_integer(t);
    case ReduceOp::kBxor:  // bool takes max / min / band / bor only
      return is_integer(t) && !is_bool;
  }
  return false;
}

}  // namespace ringcomm
