"""Tensor parallelism with Megatron-LM semantics, over one ringcomm communicator.

The four communication points are autograd functions (Megatron's f / g and their
sequence-parallel forms), each the other's transpose:

    copy_to_tp         forward identity            backward all_reduce (sum)
    reduce_from_tp     forward all_reduce (sum)    backward identity
    gather_from_tp     forward all_gather (dim)    backward keep own chunk
    scatter_to_tp      forward keep own chunk      backward all_gather (dim)
    gather_from_sp     forward all_gather (dim)    backward reduce_scatter (dim)
    reduce_scatter_to_sp forward reduce_scatter    backward all_gather (dim)

A column-parallel linear holds a block of output features (rows of the weight):
its input is replicated (copy_to_tp), or a sequence chunk gathered with
gather_from_sp. A row-parallel linear holds a block of input features (columns):
its partial outputs are summed with reduce_from_tp, or reduce-scattered along the
sequence with reduce_scatter_to_sp. An MLP is column -> GELU -> row and attention is
column (q, k, v of the local heads) -> attention -> row, so each needs one
all_reduce forward and one backward (Megatron, Shoeybi et al. 2019, section 3).

Parameters that are replicated but see only a sequence chunk under sequence
parallelism (LayerNorm, the row-parallel bias) carry ``p.sequence_parallel = True``;
their gradients are partial sums, completed by ``sync_sequence_parallel_grads``.
The shards of split parameters carry ``p.tensor_parallel = True`` (gradient clipping,
ringcomm.parallel.clip, counts them on every rank and replicated ones once). The marks
are set again when a layer is deep-copied or unpickled (which drop them).

Collectives run synchronously on the tensors' device; the communicator must hold
exactly the ranks of one tensor-parallel group (comm.rank is the shard index).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ringcomm.parallel import models

# ------------------------------------------------------------------ collectives


def _all_reduce(x, comm):
    if comm.world_size == 1:
        return x
    y = x.contiguous().clone()  # never reduce a tensor autograd may hand to others
    comm.all_reduce(y)
    return y


def _all_gather(x, comm, dim):
    """Concatenation of every rank's x along dim, in rank order."""
    ws = comm.world_size
    if ws == 1:
        return x
    dim = dim % x.dim()
    x = x.contiguous()
    out = torch.empty((ws,) + tuple(x.shape), dtype=x.dtype, device=x.device)
    comm.all_gather(out, x)
    if dim == 0:
        return out.reshape((ws * x.shape[0],) + tuple(x.shape[1:]))
    return torch.cat(out.unbind(0), dim=dim)


def _reduce_scatter(x, comm, dim):
    """This rank's chunk along dim of the sum of every rank's x."""
    ws = comm.world_size
    if ws == 1:
        return x
    dim = dim % x.dim()
    if x.shape[dim] % ws:
        raise ValueError(f"reduce_scatter: dim {dim} of size {x.shape[dim]} does not divide by "
                         f"the tensor-parallel size {ws}")
    inp = torch.stack(x.chunk(ws, dim=dim)) if dim else x.contiguous()
    out = torch.empty_like(x.narrow(dim, 0, x.shape[dim] // ws), memory_format=torch.contiguous_format)
    comm.reduce_scatter(out, inp)
    return out


def _chunk(x, comm, dim):
    ws = comm.world_size
    if ws == 1:
        return x
    if x.shape[dim] % ws:
        raise ValueError(f"split: dim {dim} of size {x.shape[dim]} does not divide by the "
                         f"tensor-parallel size {ws}")
    return x.chunk(ws, dim=dim)[comm.rank].contiguous()


# ------------------------------------------------------------- autograd functions


def _identity(x, comm, dim):
    return x.view_as(x)


def _sum(x, comm, dim):
    return _all_reduce(x, comm)


class _Conjugate(torch.autograd.Function):
    """forward: fwd(x, comm, dim); backward: bwd(grad, comm, dim). Every layer's
    communication is one such pair (Megatron's f/g and their sequence-parallel twins)."""

    @staticmethod
    def forward(ctx, x, comm, dim, fwd, bwd):
        ctx.comm, ctx.dim, ctx.bwd = comm, dim, bwd
        return fwd(x, comm, dim)

    @staticmethod
    def backward(ctx, g):
        return ctx.bwd(g, ctx.comm, ctx.dim), None, None, None, None


def copy_to_tp(x, comm):
    """Identity forward; all_reduce (sum) of the gradient backward."""
    return _Conjugate.apply(x, comm, None, _identity, _sum)


def reduce_from_tp(x, comm):
    """all_reduce (sum) forward; identity backward."""
    return _Conjugate.apply(x, comm, None, _sum, _identity)


def gather_from_tp(x, comm, dim=-1):
    """all_gather along dim forward; this rank's chunk of the gradient backward."""
    return _Conjugate.apply(x, comm, dim, _all_gather, _chunk)


def scatter_to_tp(x, comm, dim=-1):
    """This rank's chunk along dim forward; all_gather of the gradient backward."""
    return _Conjugate.apply(x, comm, dim, _chunk, _all_gather)


def gather_from_sp(x, comm, dim=1):
    """Sequence parallel: all_gather along dim forward; reduce_scatter backward."""
    return _Conjugate.apply(x, comm, dim, _all_gather, _reduce_scatter)


def reduce_scatter_to_sp(x, comm, dim=1):
    """Sequence parallel: reduce_scatter along dim forward; all_gather backward."""
    return _Conjugate.apply(x, comm, dim, _reduce_scatter, _all_gather)


def split_sequence(x, comm, dim=1):
    """This rank's sequence chunk of a replicated tensor (no autograd communication:
    use it on inputs, where every rank holds the same full tensor)."""
    return _chunk(x, comm, dim)


# -------------------------------------------------------------------- layers


def _shard_size(n, comm, what):
    if n % comm.world_size:
        raise ValueError(f"{what} {n} does not divide by the tensor-parallel size {comm.world_size}")
    return n // comm.world_size


def _mark_tensor_parallel(*params):
    """Marks shards of a parameter split over the group (each rank holds a different
    part): gradient clipping counts them on every rank, replicated ones once."""
    for p in params:
        if p is not None:
            p.tensor_parallel = True


def _mark_sequence_parallel(module):
    for p in module.parameters():
        p.sequence_parallel = True
    return module


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's rows (output features) split over the group.

    Forward: copy_to_tp(x) (or gather_from_sp(x) under sequence parallelism), then the
    local linear; the output holds this rank's out_features / tp columns, or all of them
    with gather_output=True. A new layer draws its shard from nn.Linear's distribution
    (reset=False leaves it uninitialised); from_dense makes it the shard of a given
    dense layer, so that the sharded model equals the dense one.
    """

    def __init__(self, in_features, out_features, comm, bias=True, gather_output=False,
                 sequence_parallel=False, seq_dim=1, device=None, dtype=None, reset=True):
        super().__init__()
        if gather_output and sequence_parallel:
            raise ValueError("gather_output and sequence_parallel exclude each other")
        self.comm = comm
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.sequence_parallel, self.seq_dim = gather_output, sequence_parallel, seq_dim
        local = _shard_size(out_features, comm, "out_features")
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(local, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(local, **kw)) if bias else None
        self._mark()
        if reset:
            self.reset_parameters()

    def _mark(self):
        _mark_tensor_parallel(self.weight, self.bias)

    def __setstate__(self, state):  # copy.deepcopy and pickle drop a Parameter's attributes
        super().__setstate__(state)
        self._mark()

    def reset_parameters(self):
        # nn.Linear's distribution (kaiming_uniform with a=sqrt(5)) for the full matrix.
        bound = 1.0 / self.in_features ** 0.5
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_dense(cls, linear, comm, rows=None, **kw):
        """The shard of `linear` (an nn.Linear) that this rank holds; `rows` overrides
        which output features (an index tensor), e.g. for stacked q/k/v."""
        self = cls(linear.in_features, linear.out_features, comm, bias=linear.bias is not None,
                   device=linear.weight.device, dtype=linear.weight.dtype, reset=False, **kw)
        if rows is None:
            n = self.weight.shape[0]
            rows = torch.arange(comm.rank * n, (comm.rank + 1) * n, device=linear.weight.device)
        with torch.no_grad():
            self.weight.copy_(linear.weight[rows])
            if self.bias is not None:
                self.bias.copy_(linear.bias[rows])
        return self

    def forward(self, x):
        if self.sequence_parallel:
            x = gather_from_sp(x, self.comm, self.seq_dim)
        else:
            x = copy_to_tp(x, self.comm)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_tp(y, self.comm, -1) if self.gather_output else y

    def extra_repr(self):
        return (f"in={self.in_features}, out={self.out_features} (local {self.weight.shape[0]}), "
                f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's columns (input features) split over the group.

    The input is this rank's in_features / tp features (input_is_parallel=True) or
    the full input, split here. Partial outputs are summed with reduce_from_tp, or
    reduce-scattered along the sequence under sequence parallelism. The bias is
    replicated and added once, after the reduction.
    """

    def __init__(self, in_features, out_features, comm, bias=True, input_is_parallel=True,
                 sequence_parallel=False, seq_dim=1, device=None, dtype=None, reset=True):
        super().__init__()
        self.comm = comm
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel, self.seq_dim = sequence_parallel, seq_dim
        local = _shard_size(in_features, comm, "in_features")
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, local, **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self._mark()
        if reset:
            self.reset_parameters()

    def _mark(self):
        _mark_tensor_parallel(self.weight)  # the bias is replicated
        if self.bias is not None and self.sequence_parallel:
            self.bias.sequence_parallel = True

    def __setstate__(self, state):  # as ColumnParallelLinear's
        super().__setstate__(state)
        self._mark()

    def reset_parameters(self):
        bound = 1.0 / self.in_features ** 0.5
        nn.init.uniform_(self.weight, -bound, bound)  # as for ColumnParallelLinear
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_dense(cls, linear, comm, cols=None, **kw):
        """The shard of `linear` this rank holds; `cols` overrides which input features."""
        self = cls(linear.in_features, linear.out_features, comm, bias=linear.bias is not None,
                   device=linear.weight.device, dtype=linear.weight.dtype, reset=False, **kw)
        if cols is None:
            n = self.weight.shape[1]
            cols = torch.arange(comm.rank * n, (comm.rank + 1) * n, device=linear.weight.device)
        with torch.no_grad():
            self.weight.copy_(linear.weight[:, cols])
            if self.bias is not None:
                self.bias.copy_(linear.bias)
        return self

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.comm, -1)
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sp(y, self.comm, self.seq_dim)
        else:
            y = reduce_from_tp(y, self.comm)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return (f"in={self.in_features} (local {self.weight.shape[1]}), out={self.out_features}, "
                f"sequence_parallel={self.sequence_parallel}")


class TensorParallelMLP(nn.Module):
    """models.MLP split over the group: fc1 by columns, fc2 by rows."""

    def __init__(self, hidden, ffn, comm, sequence_parallel=False, seq_dim=1):
        super().__init__()
        kw = {"sequence_parallel": sequence_parallel, "seq_dim": seq_dim}
        self.fc1 = ColumnParallelLinear(hidden, ffn, comm, **kw)
        self.fc2 = RowParallelLinear(ffn, hidden, comm, **kw)

    @classmethod
    def from_dense(cls, mlp, comm, sequence_parallel=False, seq_dim=1):
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        kw = {"sequence_parallel": sequence_parallel, "seq_dim": seq_dim}
        self.fc1 = ColumnParallelLinear.from_dense(mlp.fc1, comm, **kw)
        self.fc2 = RowParallelLinear.from_dense(mlp.fc2, comm, **kw)
        return self

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class TensorParallelAttention(nn.Module):
    """models.SelfAttention split by heads: each rank holds n_heads / tp heads' q, k, v
    rows (column parallel) and the matching columns of the output projection (row
    parallel)."""

    def __init__(self, hidden, n_heads, comm, sequence_parallel=False, seq_dim=1):
        super().__init__()
        self.local_heads = _shard_size(n_heads, comm, "n_heads")
        kw = {"sequence_parallel": sequence_parallel, "seq_dim": seq_dim}
        self.hidden, self.n_heads = hidden, n_heads
        self.qkv = ColumnParallelLinear(hidden, 3 * hidden, comm, **kw)
        self.proj = RowParallelLinear(hidden, hidden, comm, **kw)

    @classmethod
    def from_dense(cls, attn, comm, sequence_parallel=False, seq_dim=1):
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        h, nh = attn.hidden, attn.n_heads
        self.hidden, self.n_heads = h, nh
        self.local_heads = _shard_size(nh, comm, "n_heads")
        width = self.local_heads * (h // nh)  # this rank's columns of q (and of k, v)
        dev = attn.qkv.weight.device
        mine = torch.arange(comm.rank * width, (comm.rank + 1) * width, device=dev)
        rows = torch.cat([mine, mine + h, mine + 2 * h])
        kw = {"sequence_parallel": sequence_parallel, "seq_dim": seq_dim}
        self.qkv = ColumnParallelLinear.from_dense(attn.qkv, comm, rows=rows, **kw)
        self.proj = RowParallelLinear.from_dense(attn.proj, comm, cols=mine, **kw)
        return self

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(models.attention(q, k, v, self.local_heads))


class TensorParallelBlock(nn.Module):
    """models.Block with tensor-parallel attention and MLP; LayerNorms replicated
    (sequence-parallel: they see the local sequence chunk and are marked)."""

    def __init__(self, ln1, attn, ln2, mlp, sequence_parallel):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = ln1, attn, ln2, mlp
        self.sequence_parallel = sequence_parallel
        self._mark()

    def _mark(self):
        if self.sequence_parallel:
            _mark_sequence_parallel(self.ln1)
            _mark_sequence_parallel(self.ln2)

    def __setstate__(self, state):  # as ColumnParallelLinear's
        super().__setstate__(state)
        self._mark()

    @classmethod
    def from_dense(cls, block, comm, sequence_parallel=False, seq_dim=1):
        import copy

        return cls(copy.deepcopy(block.ln1),
                   TensorParallelAttention.from_dense(block.attn, comm, sequence_parallel, seq_dim),
                   copy.deepcopy(block.ln2),
                   TensorParallelMLP.from_dense(block.mlp, comm, sequence_parallel, seq_dim),
                   sequence_parallel)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def tensor_parallel(module, comm, sequence_parallel=False, seq_dim=1):
    """A copy of a dense module in which every models.Block, SelfAttention and MLP is
    replaced by its tensor-parallel form (initialised from the dense weights); all
    other modules are deep-copied and stay replicated."""
    import copy

    kinds = ((models.Block, TensorParallelBlock), (models.SelfAttention, TensorParallelAttention),
             (models.MLP, TensorParallelMLP))
    memo = {}

    def visit(m):
        for dense, parallel in kinds:
            if isinstance(m, dense):
                memo[id(m)] = parallel.from_dense(m, comm, sequence_parallel, seq_dim)
                return
        for child in m.children():
            visit(child)

    visit(module)
    return copy.deepcopy(module, memo)  # deepcopy takes the memo's replacements as they are


def sync_sequence_parallel_grads(module, comm):
    """Sums, over the group, the gradients of parameters marked sequence_parallel
    (each rank's gradient covers only its sequence chunk). One all_reduce."""
    params = [p for p in module.parameters()
              if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not params or comm.world_size == 1:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n
