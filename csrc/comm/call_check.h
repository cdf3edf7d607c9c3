// One call, described once and checked once (after NCCL's ArgsCheck over
// ncclInfo): every communicator (CPU, GPU over NCCL, GPU over cuda_ipc), the
// plan checker and the Python layers (through the bindings) fill a CallDesc
// and call check_call, so each rule (present buffers, one dtype, counts,
// in-place forms, root and peer ranges, reduce ops) is written here only.
//
// Errors are the API's: TypeError for a dtype that differs, ValueError for
// everything else, raised before anything is sent, each naming the argument
// as the caller spelled it ("tensor", "output", "input", "src", "dst") and
// what was expected and found.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/algo_choice.h"
#include "comm/buffer.h"
#include "comm/describe.h"

namespace ringcomm {

// recv's src for a message from any rank (MPI_ANY_SOURCE).
constexpr int kAnySource = -1;

struct CallDesc {
  OpKind kind = OpKind::kAllReduce;
  bool is_send = false;  // kSend: a send (else a recv)
  int rank = 0;          // this rank in the communicator
  int world = 1;
  // out: the in-place buffer ("tensor": all_reduce, broadcast, reduce,
  // send, recv) or the output; in: the input of out-of-place calls. A rooted
  // call's buffer that only the root uses may be absent on the other ranks.
  Buffer out, in;
  int root = -1;  // rooted calls: the root; send: dst; recv: src (kAnySource)
  ReduceOp op = ReduceOp::kSum;
  bool reduces = false;  // all_reduce, reduce_scatter, reduce
  Algo algo = Algo::kAuto;  // what the call asked for (algo=); the chooser decides
  int device = -1;          // CUDA device of the buffers (-1: host memory)
  uintptr_t stream = 0;     // CUDA stream the call is ordered after (0: none / default)
};

// The descriptor of a call of `kind` on this rank, with the argument names
// and the reduce flag filled in (describe_* below do the same per family).
CallDesc describe_call(OpKind kind, int rank, int world, Buffer out, Buffer in, int root, ReduceOp op);
CallDesc describe_p2p(bool is_send, int rank, int world, Buffer x, int peer);

// Throws TypeError / ValueError for a call that breaks a rule; returns
// normally for a valid one. Rooted calls check the root-only buffers on the
// root alone, as MPI does.
void check_call(const CallDesc& d);

// The call's dtype (the output's, or the input's when only that is present).
DataType call_dtype(const CallDesc& d);
// Elements as CallPlan::count counts them: the buffer (all_reduce, broadcast,
// reduce, send, recv), the output (reduce_scatter, scatter), the input
// (all_gather, gather, all_to_all); the same on every rank of a valid call.
size_t call_count(const CallDesc& d);
// The size of the call as the cost model and nccl-tests count it: every
// rank's data for reduce_scatter, scatter, all_gather and gather.
size_t call_model_bytes(const CallDesc& d);

// ValueError unless 0 <= r < world ("<arg> 5 is out of range for a
// communicator of world size 4"): roots, peers, and any rank argument.
void check_rank(int r, int world, const char* arg);

// TypeError unless an output and an input of dtypes named `output` and
// `input` agree: the same-dtype rule, for callers whose buffers are lists
// of tensors (the torch backend) as well as for check_call.
void check_same_dtype_names(const char* op, const char* output, const char* input);

// The argument names of a call in messages.
const char* root_arg_name(OpKind kind, bool is_send);  // "src" / "dst"

}  // namespace ringcomm
