#include "comm/call_check.h"

#include <string>

#include "comm/call_plan.h"
#include "ringcomm/types.h"

namespace ringcomm {
namespace {

std::string str(size_t v) { return std::to_string(v); }

bool overlaps(const Buffer& x, const Buffer& y) {
  if (x.nbytes() == 0 || y.nbytes() == 0) return false;
  return x.ptr < y.ptr + y.nbytes() && y.ptr < x.ptr + x.nbytes();
}

void require_present(const Buffer& b, const char* arg, const char* op) {
  if (!b.present) throw ValueError(std::string(op) + ": " + arg + " is required, got None");
}

void require_same_dtype(const Buffer& out, const Buffer& in, const char* op) {
  if (out.dtype != in.dtype) check_same_dtype_names(op, dtype_name(out.dtype), dtype_name(in.dtype));
}

void require_op(DataType t, ReduceOp op, const char* name) {
  if (static_cast<int>(t) >= kNumDataTypes) {
    throw ValueError(std::string(name) + ": invalid dtype code " + std::to_string(static_cast<int>(t)));
  }
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw ValueError(std::string(name) + ": invalid reduce op code " + std::to_string(static_cast<int>(op)));
  }
  if (!reduce_op_supported(t, op)) {
    throw ValueError(std::string("reduce op ") + reduce_op_name(op) + " is not defined for " + dtype_name(t));
  }
}

// `big` must hold world * `small` elements ("input must hold world_size * output elements").
void require_world_times(const Buffer& big, const Buffer& small, int world, const char* op, const char* big_name,
                         const char* small_name) {
  const size_t want = small.count * static_cast<size_t>(world);
  if (big.count != want) {
    throw ValueError(std::string(op) + ": " + big_name + " must hold world_size * " + small_name + " elements (" +
                     str(world) + " * " + str(small.count) + " = " + str(want) + "), got " + str(big.count));
  }
}

// In-place forms: `part` may overlap `whole` only as whole's block of this rank.
void require_block_of_rank(const Buffer& whole, const Buffer& part, int rank, const char* op, const char* part_name,
                           const char* whole_name) {
  if (overlaps(whole, part) && part.ptr != whole.ptr + static_cast<size_t>(rank) * part.nbytes()) {
    throw ValueError(std::string(op) + ": " + part_name + " overlaps " + whole_name + " but is not " + whole_name +
                     "'s block of rank " + std::to_string(rank) + " (the one in-place form: " + part_name + " == " +
                     whole_name + "[rank * len(" + part_name + "):(rank + 1) * len(" + part_name + ")])");
  }
}

}  // namespace

void check_same_dtype_names(const char* op, const char* output, const char* input) {
  if (std::string(output) != input) {
    throw TypeError(std::string(op) + ": output has dtype " + output + " but input has dtype " + input +
                    "; they must match");
  }
}

void check_rank(int r, int world, const char* arg) {
  if (r < 0 || r >= world) {
    throw ValueError(std::string(arg) + " " + std::to_string(r) + " is out of range for a communicator of world size " +
                     std::to_string(world));
  }
}

const char* root_arg_name(OpKind kind, bool is_send) {
  switch (kind) {
    case OpKind::kBroadcast:
    case OpKind::kScatter: return "src";
    case OpKind::kReduce:
    case OpKind::kGather: return "dst";
    case OpKind::kSend: return is_send ? "dst" : "src";
    default: return "root";
  }
}

CallDesc describe_call(OpKind kind, int rank, int world, Buffer out, Buffer in, int root, ReduceOp op) {
  CallDesc d;
  d.kind = kind;
  d.rank = rank;
  d.world = world;
  d.out = out;
  d.in = in;
  d.root = root;
  d.op = op;
  d.reduces = op_reduces(kind);
  return d;
}

CallDesc describe_p2p(bool is_send, int rank, int world, Buffer x, int peer) {
  CallDesc d = describe_call(OpKind::kSend, rank, world, x, Buffer{}, peer, ReduceOp::kSum);
  d.is_send = is_send;
  return d;
}

void check_call(const CallDesc& d) {
  const char* name = d.kind == OpKind::kSend ? (d.is_send ? "send" : "recv") : op_kind_name(d.kind);
  if (d.world < 1) throw ValueError(std::string(name) + ": world size must be at least 1, got " + std::to_string(d.world));
  check_rank(d.rank, d.world, "rank");
  const bool at_root = d.rank == d.root;
  switch (d.kind) {
    case OpKind::kAllReduce:
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      require_present(d.out, "tensor", name);
      if (is_rooted(d.kind)) check_rank(d.root, d.world, root_arg_name(d.kind, false));
      break;
    case OpKind::kReduceScatter:
      require_present(d.out, "output", name);
      require_present(d.in, "input", name);
      require_same_dtype(d.out, d.in, name);
      require_world_times(d.in, d.out, d.world, name, "input", "output");
      require_block_of_rank(d.in, d.out, d.rank, name, "output", "input");
      break;
    case OpKind::kAllGather:
      require_present(d.out, "output", name);
      require_present(d.in, "input", name);
      require_same_dtype(d.out, d.in, name);
      require_world_times(d.out, d.in, d.world, name, "output", "input");
      require_block_of_rank(d.out, d.in, d.rank, name, "input", "output");
      break;
    case OpKind::kScatter:
      require_present(d.out, "output", name);
      check_rank(d.root, d.world, "src");
      if (at_root) {
        require_present(d.in, "input (on the src rank)", name);
        require_same_dtype(d.out, d.in, name);
        require_world_times(d.in, d.out, d.world, name, "input", "output");
        require_block_of_rank(d.in, d.out, d.rank, name, "output", "input");
      }
      break;
    case OpKind::kGather:
      require_present(d.in, "input", name);
      check_rank(d.root, d.world, "dst");
      if (at_root) {
        require_present(d.out, "output (on the dst rank)", name);
        require_same_dtype(d.out, d.in, name);
        require_world_times(d.out, d.in, d.world, name, "output", "input");
        require_block_of_rank(d.out, d.in, d.rank, name, "input", "output");
      }
      break;
    case OpKind::kAllToAll:
      require_present(d.out, "output", name);
      require_present(d.in, "input", name);
      require_same_dtype(d.out, d.in, name);
      if (d.out.count != d.in.count) {
        throw ValueError(std::string(name) + ": output and input must hold the same number of elements, got " +
                         str(d.out.count) + " and " + str(d.in.count));
      }
      if (d.in.count % static_cast<size_t>(d.world) != 0) {
        throw ValueError(std::string(name) + ": input elements (" + str(d.in.count) +
                         ") must divide evenly by world size " + std::to_string(d.world));
      }
      if (overlaps(d.out, d.in)) {
        throw ValueError(std::string(name) + ": output and input overlap; in-place is not supported");
      }
      break;
    case OpKind::kSend: {
      require_present(d.out, "tensor", name);
      const char* arg = root_arg_name(d.kind, d.is_send);
      if (!d.is_send && d.root == kAnySource) {
        if (d.world == 1) {
          throw ValueError("recv: src=ANY_SOURCE (any source) on a communicator of world size 1: there is no other "
                           "rank to receive from");
        }
        break;
      }
      check_rank(d.root, d.world, arg);
      if (d.root == d.rank) {
        throw ValueError(std::string(arg) + " " + std::to_string(d.root) + " is this rank; send/recv need another rank");
      }
      break;
    }
    case OpKind::kBarrier:
      break;
    default:
      throw ValueError("invalid collective code " + std::to_string(static_cast<int>(d.kind)));
  }
  if (d.reduces) require_op(call_dtype(d), d.op, name);
}

DataType call_dtype(const CallDesc& d) { return d.out.present ? d.out.dtype : d.in.dtype; }

size_t call_count(const CallDesc& d) {
  switch (d.kind) {
    case OpKind::kAllGather:
    case OpKind::kGather:
    case OpKind::kAllToAll: return d.in.count;
    case OpKind::kBarrier: return 0;
    default: return d.out.count;
  }
}

size_t call_model_bytes(const CallDesc& d) {
  size_t in = 0, out = 0;
  call_buffer_bytes(d.kind, call_count(d), dtype_size(call_dtype(d)), d.world, &in, &out);
  switch (d.kind) {
    case OpKind::kReduceScatter:
    case OpKind::kScatter: return in;   // every rank's blocks
    case OpKind::kAllGather:
    case OpKind::kGather: return out;   // the gathered whole
    default: return out ? out : in;
  }
}

}  // namespace ringcomm
