"""Gradient clipping by the global norm of a model split over data-, tensor- and
pipeline-parallel groups (as Megatron-LM's clip_grad_norm_fp32 and DeepSpeed do).

The global norm is the norm of the dense model's gradient. Each rank adds the p-th
powers of the elements it is the one to count, and the sums are all-reduced:

- a parameter the TP layers shard (marked ``tensor_parallel`` by ColumnParallelLinear
  and RowParallelLinear) is counted on every tensor-parallel rank (each holds its own
  shard); a replicated parameter (LayerNorms, embeddings, RowParallelLinear's bias)
  only on tensor-parallel rank 0, so that it is not counted tp times;
- every pipeline stage counts its own parameters;
- under ZeRO every data-parallel rank counts its own gradient shard; under replicated
  data parallelism the gradients are equal after the all_reduce and are counted once.

    norm = clip_grad_norm_(model.parameters(), 1.0, groups=g)   # g = split_3d(...)

ZeroDataParallel.clip_grad_norm_(max_norm, groups=g) does the same over its shards.
"""
import math

import torch


def is_tensor_parallel(param):
    """Whether `param` is a shard of a parameter split over the tensor-parallel group."""
    return bool(getattr(param, "tensor_parallel", False))


def counted_here(param, groups):
    """Whether this rank counts `param` in the global norm (see the module docstring)."""
    return groups is None or groups.tp_rank == 0 or is_tensor_parallel(param)


def check_norm_type(norm_type):
    p = float(norm_type)
    if not (p > 0):
        raise ValueError(f"norm_type must be positive (or inf), got {norm_type!r}")
    return p


def local_power(tensors, p, device=None):
    """sum |x|^p over `tensors` (max |x| for p = inf), as a float64 tensor of one element."""
    acc = torch.zeros(1, dtype=torch.float64, device=device)
    for t in tensors:
        if t.numel() == 0:
            continue
        a = t.detach().double().abs()
        if math.isinf(p):
            acc = torch.maximum(acc, a.max().reshape(1))
        elif p == 2.0:
            acc += a.square().sum()
        else:
            acc += a.pow(p).sum()
    return acc


def reduce_power(acc, p, comms):
    """All-reduces the local sums over every communicator of `comms` (None and world
    size 1 skipped) and returns the norm, a float64 tensor of one element."""
    op = "max" if math.isinf(p) else "sum"
    for c in comms:
        if c is not None and c.world_size > 1:
            c.all_reduce(acc, op=op)
    return acc if math.isinf(p) else acc.pow(1.0 / p)


def clip_coefficient(norm, max_norm):
    """The factor the gradients are scaled by (torch's clip_grad_norm_: at most 1)."""
    return min(1.0, float(max_norm) / (float(norm) + 1e-6))


def model_parallel_comms(groups, dp=None):
    """The communicators the local sums are all-reduced over: dp (ZeRO's shards; None
    under replicated data parallelism), then the TP and PP groups of `groups`."""
    if groups is None:
        return [dp]
    return [dp, groups.tp, groups.pp]


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, groups=None):
    """torch.nn.utils.clip_grad_norm_ for a model under tensor and pipeline parallelism
    with replicated data parallelism (DataParallel: call it after the gradients are
    reduced). `groups` is the rank's ParallelGroups (split_3d); None clips this rank's
    parameters alone. Returns the global norm before clipping (float32 tensor)."""
    p = check_norm_type(norm_type)
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [q.grad for q in params if q.grad is not None]
    device = grads[0].device if grads else None
    counted = [q.grad for q in params if q.grad is not None and counted_here(q, groups)]
    norm = reduce_power(local_power(counted, p, device), p, model_parallel_comms(groups))
    coef = clip_coefficient(norm, max_norm)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return norm.to(torch.float32)[0]
