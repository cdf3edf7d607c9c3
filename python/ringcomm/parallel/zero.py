"""ZeRO data parallelism (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models") on ringcomm's reduce_scatter and all_gather.

    z = ZeroDataParallel(module, comm, stage=2, optimizer_class=torch.optim.AdamW,
                         mixed_precision="bf16", lr=1e-3)
    loss_fn(z(x), y).backward(); z.clip_grad_norm_(1.0); z.step(); z.zero_grad()

Layout. The trainable parameters are grouped into units, each flattened into one
buffer padded to a multiple of N = comm.world_size and cut into N equal shards; rank r
owns shard r of every unit. Stages 1 and 2 make a unit of each gradient bucket (at
most bucket_cap_mb, in reverse registration order, as DataParallel does); stage 3
makes a unit of each module's own parameters (recurse=False), so that a module's
parameters are gathered together just before it runs. Each rank keeps, per unit, an
fp32 master copy of its shard (the parameters its optimizer sees: the wrapped torch
optimizer is built over these flat shards, so any element-wise optimizer works -- SGD,
SGD with momentum, Adam, AdamW; one that mixes elements of a tensor, such as LBFGS or
a factored optimizer, would not be equivalent and is not supported).

    stage 1  full parameters and gradients on every rank; optimizer state sharded.
             step(): reduce_scatter (AVG) of each bucket's gradients, each rank steps
             its shard, all_gather of the updated parameters.
    stage 2  plus gradients sharded: a post-accumulate-grad hook copies each gradient
             into its bucket and drops it; a full bucket's reduce_scatter is issued at
             once (async, in bucket order), overlapping the rest of backward, and adds
             into the rank's persistent gradient shard. At most two buckets are in
             flight; the buffers are freed as they complete.
    stage 3  plus parameters sharded: a module's parameters are all-gathered in its
             forward pre-hook and freed (storage resized to 0) after its forward; a
             hook on its output gathers them again before its backward, and they are
             freed once all of its gradients have arrived, which also issues the
             unit's reduce_scatter. While one module computes, the gather of the next
             one (the previous forward's order; in backward the reverse) is in flight.

Mixed precision (mixed_precision="bf16"/"fp16" or the torch dtype): the module computes
in that dtype (parameters, gradients and the collectives), floating-point inputs are
cast to it; masters and optimizer state are fp32 in the shards, so with Adam the paper's
K = 12 bytes per parameter (master 4 + momentum 4 + variance 4) are divided by N. The
gradient shard stays in the compute dtype (the paper's 2 bytes), so accumulation over
micro-batches rounds there. Without mixed precision the master is no copy: stages 1 and
2 step the rank's block of the full parameter buffer in place and all-gather in place,
stage 3 steps its parameter shard.
fp16 gets no loss scaling here: scale the loss yourself.

Accumulation: several backward passes before step() sum their gradients. Under
``with z.no_sync():`` the hooks do not communicate and gradients accumulate in full in
param.grad (in every stage; the memory ZeRO saves is spent for the duration, as FSDP's
no_sync); the first synchronised backward reduces the sum. Stage 2 and 3 reduce every
backward pass outside no_sync and add into the gradient shard.

Communication per step, counted at the call sites in comm_stats (bytes each rank sends
under the ring schedules: (N-1) blocks of a shard per reduce_scatter or all_gather):
stages 1 and 2 reduce_scatter P and all_gather P, 2 (N-1)/N P elements, the volume of a
ring all_reduce of the gradients; stage 3 gathers P twice (forward and backward) and
reduce-scatters P, 3 (N-1)/N P, 1.5x.

Sequence parallelism (the TP layers' sequence_parallel=True): the gradients of the
parameters it marks (LayerNorms, RowParallelLinear's bias) are partial sums over the
sequence chunks; pass tp_comm=g.tp and each is summed over the TP group as it arrives,
before it goes into the DP reduction (ValueError at construction without tp_comm).

Not supported (ValueError at construction): parameters of different dtypes or devices
in one model; under stage 3 a parameter shared by two modules (tied embeddings: use
stage 1 or 2). Under stage 3 every rank must run the same modules in the same order (the
gathers are collectives), and a module's parameters must be used inside its own
forward (code that reads child.weight from a parent's forward sees an empty tensor).
Frozen parameters (requires_grad=False) are left replicated and untouched.
"""
import collections
import contextlib
import copy
import functools

import torch
import torch.nn as nn

from ringcomm.parallel import clip
from ringcomm.parallel.dp import broadcast_tensors
from ringcomm.parallel.hooks import weak_hook

_MIXED = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, torch.bfloat16: torch.bfloat16, torch.float16: torch.float16}
_FREE, _GATHERING, _GATHERED = 0, 1, 2
_MAX_IN_FLIGHT = 2  # reduce_scatters in flight before the oldest is waited for
_STATE_MODES = ("full", "consolidated", "sharded")
# torch optimizers whose update of an element depends on others of its tensor (on a flat
# shard they would compute something else) or that need a closure
_NOT_ELEMENTWISE = ("LBFGS", "Adafactor", "Muon", "SparseAdam")


class _Unit:
    """Parameters flattened into one buffer of `padded` = N * `shard` elements."""

    def __init__(self, index, params, module, world, rank):
        self.index, self.params, self.module = index, params, module
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.numel = sum(self.numels)
        self.shard = -(-self.numel // world)
        self.padded = self.shard * world
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        self.flat = None         # full parameters (compute dtype); stage 3: only while gathered
        self.param_shard = None  # stage 3: this rank's shard in the compute dtype
        self.master = None       # this rank's shard, master dtype: the optimizer's parameter
        self.grad_full = None    # stage 1: the full gradients, params' .grad are views of it
        self.grad_views = None   # stage 1: those views
        self.shared_shard = False  # without mixed precision: the master is not a copy of its own
        self.grad_shard = None   # stages 2, 3: this rank's reduced gradient shard
        self.bucket = None       # stages 2, 3: the full gradients of this backward, until reduced
        self.ready = set()       # indices of params whose gradient is in the bucket
        self.seen = set()        # stage 3: indices whose gradient arrived in this backward
        self.rs = None           # (Work, output) of the reduce_scatter in flight
        self.issued = False      # reduced in this step
        self.state, self.work = _GATHERED, None

    def view(self, flat, i):
        return flat[self.offsets[i]:self.offsets[i] + self.numels[i]].view_as(self.params[i])

    def views(self, flat):
        return [flat[o:o + n].view_as(p) for o, n, p in zip(self.offsets, self.numels, self.params)]


class ZeroDataParallel(nn.Module):
    """Wraps `module` for ZeRO data parallelism over `comm` (see the module docstring).

    Args:
        module: the replica on this rank; rank 0's parameters and buffers win.
        comm: a ringcomm Communicator over the data-parallel ranks (e.g. split_3d(...).dp).
        stage: 1, 2 or 3.
        optimizer_class: an element-wise torch optimizer class, built over this rank's
            shards with **optimizer_kwargs (one parameter group).
        mixed_precision: None, "bf16", "fp16" (or the torch dtype).
        bucket_cap_mb: stages 1 and 2: largest bucket, in MiB of the compute dtype
            (stage 3's units are the modules).
        overlap: False defers every reduce_scatter to step() and, under stage 3, turns
            off the prefetch of the next module's gather (the baseline of the benchmark).
            Stage 1 reduces in step() either way (its full gradients stay until then).
        tp_comm: the tensor-parallel communicator, needed when the module has
            sequence-parallel parameters (marked sequence_parallel by the TP layers:
            their gradients are partial sums over the sequence chunks): each such
            gradient is summed over tp_comm before it is reduced over comm (what
            sync_sequence_parallel_grads does for DataParallel, which keeps p.grad).

    z(*inputs) runs the module; after backward, z.step() finishes the reductions, steps
    this rank's shards and gathers what the stage keeps in full. z.optimizer is the
    wrapped optimizer (for learning-rate schedulers).
    """

    def __init__(self, module, comm, stage=1, optimizer_class=torch.optim.AdamW,
                 mixed_precision=None, bucket_cap_mb=25, overlap=True, tp_comm=None,
                 **optimizer_kwargs):
        super().__init__()
        if stage not in (1, 2, 3):
            raise ValueError(f"stage must be 1, 2 or 3, got {stage!r}")
        if mixed_precision is not None and mixed_precision not in _MIXED:
            raise ValueError(f"mixed_precision must be None, 'bf16' or 'fp16', got {mixed_precision!r}")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer subclass, got "
                            f"{optimizer_class!r}")
        if optimizer_class.__name__ in _NOT_ELEMENTWISE:
            raise ValueError(f"{optimizer_class.__name__} is not element-wise (its update of an element "
                             f"depends on the rest of the tensor, or it needs a closure): ZeRO steps flat "
                             f"shards, so only element-wise optimizers (SGD, Adam, AdamW, ...) are "
                             f"supported")
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb!r}")
        self.module, self.comm, self.stage, self.overlap = module, comm, stage, overlap
        # the arguments after comm: what rebuilding the layer over another communicator
        # takes (ElasticZeroDataParallel, after a rank is lost)
        self.config = dict(stage=stage, optimizer_class=optimizer_class, mixed_precision=mixed_precision,
                           bucket_cap_mb=bucket_cap_mb, overlap=overlap, tp_comm=tp_comm, **optimizer_kwargs)
        self.world, self.rank = comm.world_size, comm.rank
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the module has no trainable parameters")
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) > 1:
            raise ValueError(f"all trainable parameters must share one dtype and device, found "
                             f"{sorted(str(k) for k in kinds)}")
        self.param_dtype, self.device = next(iter(kinds))
        if not self.param_dtype.is_floating_point:
            raise ValueError(f"parameters must be floating point, got {self.param_dtype}")
        mp = _MIXED.get(mixed_precision)
        self.compute_dtype = mp or self.param_dtype
        self.master_dtype = torch.float32 if mp is not None else self.param_dtype
        self._sync = True
        self._cap = max(1, int(bucket_cap_mb * 2 ** 20))
        self._params = params
        self._managed = {id(p) for p in params}
        self._sp = {id(p) for p in params if getattr(p, "sequence_parallel", False)}
        if self._sp and tp_comm is None:
            raise ValueError(f"{len(self._sp)} parameters are marked sequence_parallel (their "
                             f"gradients are partial sums over the tensor-parallel group): pass "
                             f"tp_comm=<the tensor-parallel communicator> so that ZeRO sums them "
                             f"there before reducing them")
        self._tp = tp_comm if self._sp and tp_comm.world_size > 1 else None
        self.comm_stats = {"reduce_scatter_bytes": 0, "all_gather_bytes": 0,
                           "reduce_scatter_calls": 0, "all_gather_calls": 0}
        self.units = self._make_units(params)
        self._check_agreement()
        self._broadcast(params + list(module.buffers()))
        # since the last step: ("gather", unit, "prefetch"|"demand"), ("free", unit), ("reduce",
        # unit) -- what the tests read to see the overlap; bounded, for loops that never step
        self.events = collections.deque(maxlen=64 + 16 * len(self.units))
        self._where = {}
        for u in self.units:
            for i, p in enumerate(u.params):
                self._where[id(p)] = (u, i)
        self._init_storage()
        self.optimizer = optimizer_class([u.master for u in self.units], **optimizer_kwargs)
        if len(self.optimizer.param_groups) != 1:
            raise ValueError("the wrapped optimizer must have one parameter group")
        self._next = 0          # stage 2: next bucket to issue (buckets go in order)
        self._in_flight = []    # units whose reduce_scatter is in flight, oldest first
        self._esize = torch.empty((), dtype=self.compute_dtype).element_size()
        self._live = self._peak = 0  # bytes of buckets, reduce outputs and gathered copies
        self._reduced = False   # step()'s reductions done (clip_grad_norm_ ran them)
        self._order = list(self.units)   # stage 3: the last forward's unit order
        self._cur_order = None
        self._handles = [p.register_post_accumulate_grad_hook(weak_hook(self._on_grad)) for p in params]
        if stage == 3:
            for u in self.units:
                self._handles.append(u.module.register_forward_pre_hook(
                    functools.partial(self._pre_forward, u)))
                self._handles.append(u.module.register_forward_hook(
                    functools.partial(self._post_forward, u)))

    # -- set-up -------------------------------------------------------------------
    def _broadcast(self, tensors):
        broadcast_tensors(self.comm, tensors)

    def _make_units(self, params):
        if self.stage == 3:
            owner, groups = {}, []
            for name, m in self.module.named_modules():
                own = [p for p in m.parameters(recurse=False) if id(p) in self._managed]
                for p in own:
                    if id(p) in owner:
                        raise ValueError(
                            f"ZeRO stage 3 does not support a parameter shared between modules: "
                            f"{owner[id(p)]!r} and {name!r} hold the same parameter (tied weights); "
                            f"use stage 1 or 2, or untie it")
                    owner[id(p)] = name
                if own:
                    groups.append((own, m))
            return [_Unit(i, ps, m, self.world, self.rank) for i, (ps, m) in enumerate(groups)]
        esize = torch.empty((), dtype=self.compute_dtype).element_size()
        buckets, cur, size = [], None, 0
        for p in reversed(params):
            nbytes = p.numel() * esize
            if cur is None or (size + nbytes > self._cap and cur):
                cur, size = [], 0
                buckets.append(cur)
            cur.append(p)
            size += nbytes
        return [_Unit(i, ps, None, self.world, self.rank) for i, ps in enumerate(buckets)]

    def _check_agreement(self):
        """Every rank must build the same units (the collectives are sized by them)."""
        mine = torch.tensor([self.stage, len(self.units), sum(u.padded for u in self.units),
                             hash(tuple(u.padded for u in self.units)) % (2 ** 61)], dtype=torch.int64)
        every = torch.empty(self.world * mine.numel(), dtype=torch.int64)
        self.comm.all_gather(every, mine)
        rows = every.view(self.world, -1).tolist()
        if any(r != rows[0] for r in rows):
            desc = "; ".join(f"rank {i}: stage {r[0]}, {r[1]} units, {r[2]} elements"
                             for i, r in enumerate(rows))
            raise ValueError(f"ZeroDataParallel: the ranks disagree on the stage or the model ({desc})")

    @torch.no_grad()
    def _init_storage(self):
        for u in self.units:
            full = torch.zeros(u.padded, dtype=self.param_dtype, device=self.device)
            for v, p in zip(u.views(full), u.params):
                v.copy_(p.detach())
            u.flat = full.to(self.compute_dtype, copy=True)
            same = self.compute_dtype == self.master_dtype
            if same and self.stage != 3:
                # the master is this rank's block of the full buffer: the optimizer steps the
                # parameters in place and the all_gather runs in place (its input is output
                # block `rank`, which ringcomm's schedules allow), no copy of the shard
                u.master = nn.Parameter(u.flat[u.lo:u.hi])
                u.shared_shard = True
            else:
                u.master = nn.Parameter(full[u.lo:u.hi].to(self.master_dtype, copy=True))
            for v, p in zip(u.views(u.flat), u.params):
                p.data = v
                p.grad = None
            if self.stage == 1:
                u.grad_full = torch.zeros(u.padded, dtype=self.compute_dtype, device=self.device)
                u.grad_views = u.views(u.grad_full)
                for v, p in zip(u.grad_views, u.params):
                    p.grad = v
            else:
                u.grad_shard = torch.zeros(u.shard, dtype=self.compute_dtype, device=self.device)
            if self.stage == 3:
                u.shared_shard = self.compute_dtype == self.master_dtype
                u.param_shard = u.master.data if u.shared_shard else u.flat[u.lo:u.hi].clone()
                u.flat.untyped_storage().resize_(0)
                u.state = _FREE

    # -- communication --------------------------------------------------------------
    def _count(self, kind, shard, dtype):
        esize = torch.empty((), dtype=dtype).element_size()
        self.comm_stats[f"{kind}_bytes"] += (self.world - 1) * shard * esize
        self.comm_stats[f"{kind}_calls"] += 1

    def _all_gather(self, out, shard):
        self._count("all_gather", shard.numel(), shard.dtype)
        return self.comm.all_gather(out, shard, async_op=True)

    # -- stage 3: gathering and freeing ------------------------------------------
    def _gather(self, u, prefetch=False):
        if u.state != _FREE:
            return
        u.flat.untyped_storage().resize_(u.padded * u.flat.element_size())
        self._grow(u.padded)
        u.work, u.state = self._all_gather(u.flat, u.param_shard), _GATHERING
        self.events.append(("gather", u.index, "prefetch" if prefetch else "demand"))

    def _ensure(self, u):
        self._gather(u)
        if u.state == _GATHERING:
            u.work.wait()
            u.work, u.state = None, _GATHERED

    def _free(self, u):
        if u.state == _GATHERING:
            u.work.wait()
            u.work = None
        if u.state != _FREE:
            self.events.append(("free", u.index))
        if u.flat.untyped_storage().nbytes():
            self._live -= u.flat.untyped_storage().nbytes()
        u.flat.untyped_storage().resize_(0)
        u.state = _FREE

    def _neighbour(self, u, step):
        order = self._order
        for i, v in enumerate(order):
            if v is u:
                j = i + step
                return order[j] if 0 <= j < len(order) else None
        return None

    def _pre_forward(self, u, module, args):
        self._ensure(u)
        if self._cur_order is not None:
            self._cur_order.append(u)
        if self.overlap:
            nxt = self._neighbour(u, 1)
            if nxt is not None:
                self._gather(nxt, prefetch=True)

    def _post_forward(self, u, module, args, output):
        if torch.is_grad_enabled():
            t = _first_grad_tensor(output)
            if t is not None:
                t.register_hook(weak_hook(self._pre_backward_hook, u))
        self._free(u)

    def _pre_backward_hook(self, u, grad):
        self._pre_backward(u)  # the gradient passes unchanged

    def _pre_backward(self, u):
        self._ensure(u)
        if self.overlap:
            prev = self._neighbour(u, -1)
            if prev is not None:
                self._gather(prev, prefetch=True)

    # -- backward -----------------------------------------------------------------
    def _on_grad(self, p):
        u, i = self._where[id(p)]
        if self.stage == 1:  # gradients stay in the full buffer (accumulating in place)
            v = u.grad_views[i]
            if p.grad is not v:
                if p.grad.data_ptr() != v.data_ptr() or p.grad.shape != v.shape:
                    v.copy_(p.grad)
                p.grad = v
            return
        if self.stage == 3:
            u.seen.add(i)
        if self._sync:
            self._reduced = False
            if u.rs is not None:  # a second backward while this unit's reduction is in flight
                self._in_flight.remove(u)
                self._retire(u)
            if u.bucket is None:
                self._new_bucket(u)
            self._sum_sequence_parallel(p, p.grad)
            v = u.view(u.bucket, i)
            if i in u.ready:  # a second backward before the reduction
                v.add_(p.grad)
            else:
                v.copy_(p.grad)
            p.grad = None
            u.ready.add(i)
            if self.overlap:
                if self.stage == 2:
                    while self._next < len(self.units) and len(self.units[self._next].ready) == len(
                            self.units[self._next].params):
                        self._issue(self.units[self._next])
                elif len(u.ready) == len(u.params):
                    self._issue(u)
        if self.stage == 3 and len(u.seen) == len(u.params):
            u.seen.clear()
            self._free(u)  # its backward is over

    def _sum_sequence_parallel(self, p, grad):
        """A sequence-parallel parameter's gradient, summed over the TP group in place
        (every TP rank runs the same backward, so the calls meet in the same order)."""
        if self._tp is not None and id(p) in self._sp:
            self._tp.all_reduce(grad)

    def _new_bucket(self, u):
        # empty, not zeros: every parameter's slice is written once (copy or zero), the pad here
        u.bucket = torch.empty(u.padded, dtype=self.compute_dtype, device=self.device)
        u.bucket[u.numel:].zero_()
        self._grow(u.padded)

    def _grow(self, elements):
        self._live += elements * self._esize
        self._peak = max(self._peak, self._live)

    def _issue(self, u):
        """reduce_scatter (AVG) of the unit's bucket; p.grad of params not in it is used too."""
        if u.bucket is None:
            self._new_bucket(u)
        for i, p in enumerate(u.params):
            if i not in u.ready:  # no gradient in this backward: accumulated under no_sync, or 0
                v = u.view(u.bucket, i)
                if p.grad is None:
                    v.zero_()
                else:
                    self._sum_sequence_parallel(p, p.grad)
                    v.copy_(p.grad)
                    p.grad = None
        while len(self._in_flight) >= _MAX_IN_FLIGHT:
            self._retire(self._in_flight.pop(0))
        out = torch.empty(u.shard, dtype=self.compute_dtype, device=self.device)
        self._grow(u.shard)
        self._count("reduce_scatter", u.shard, self.compute_dtype)
        u.rs = (self.comm.reduce_scatter(out, u.bucket, op="avg", async_op=True), out)
        self.events.append(("reduce", u.index))
        u.ready.clear()
        u.issued = True
        self._in_flight.append(u)
        if self.stage == 2 and u.index == self._next:
            self._next += 1

    def _retire(self, u):
        work, out = u.rs
        work.wait()
        if u.grad_shard is None:  # freed by zero_grad(set_to_none=True): take the output
            u.grad_shard = out
        else:
            u.grad_shard += out
        u.rs, u.bucket = None, None
        self._live -= (u.padded + u.shard) * self._esize

    def _flush(self, every_unit):
        """Stages 2 and 3: issues (in unit order) what the last backward left unreduced,
        and with every_unit each unit not reduced in this step (a zero contribution, so
        that every rank issues the same calls), then waits for all."""
        for u in self.units:
            pending = bool(u.ready) or any(p.grad is not None for p in u.params)
            if pending or (every_unit and not u.issued):
                if u.rs is not None:
                    self._in_flight.remove(u)
                    self._retire(u)
                self._issue(u)
        while self._in_flight:
            self._retire(self._in_flight.pop(0))
        self._next = 0

    def _finish(self):
        """Reduces the gradients into each rank's shard and sets the masters' .grad."""
        if self._reduced:
            return
        if self.stage == 1:
            works = []
            for u in self.units:
                for v, p in zip(u.grad_views, u.params):
                    if p.grad is None:
                        v.zero_()
                        p.grad = v
                    elif p.grad is not v:
                        v.copy_(p.grad)
                        p.grad = v
                    self._sum_sequence_parallel(p, v)
                out = torch.empty(u.shard, dtype=self.compute_dtype, device=self.device)
                self._count("reduce_scatter", u.shard, self.compute_dtype)
                works.append((self.comm.reduce_scatter(out, u.grad_full, op="avg", async_op=True), out))
            for u, (w, out) in zip(self.units, works):
                w.wait()
                u.master.grad = out.to(self.master_dtype)
        else:
            self._flush(every_unit=True)
            for u in self.units:
                # the shard itself where the dtypes agree (clipping scales it in place; the
                # next zero_grad clears it), an fp32 copy under mixed precision
                u.master.grad = u.grad_shard.to(self.master_dtype)
                u.issued = False
            if self.stage == 3:
                for u in self.units:
                    u.seen.clear()
                    self._free(u)
        self._reduced = True

    # -- the training-loop API ----------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.stage != 1 and self._sync and any(u.ready or u.rs for u in self.units):
            self._flush(every_unit=False)  # the last backward's reductions land before new gradients
        if self.compute_dtype != self.param_dtype:
            args = tuple(_cast(a, self.compute_dtype) for a in args)
            kwargs = {k: _cast(v, self.compute_dtype) for k, v in kwargs.items()}
        if self.stage != 3:
            return self.module(*args, **kwargs)
        self._cur_order = []
        try:
            return self.module(*args, **kwargs)
        finally:
            if self._cur_order:
                self._order = self._cur_order
            self._cur_order = None

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm, norm_type=2.0, groups=None):
        """Finishes the reductions, then scales every gradient shard so that the global
        norm is at most max_norm (torch.nn.utils.clip_grad_norm_'s rule); returns the
        global norm before clipping. Each rank adds |g|^p over its shards, and the sums
        are all-reduced over the data-parallel communicator. Under tensor and pipeline
        parallelism pass the rank's ParallelGroups (split_3d; its dp must be this
        wrapper's communicator): the sums then also go over groups.tp and groups.pp,
        with replicated parameters counted on tensor-parallel rank 0 only
        (ringcomm.parallel.clip), so that the norm is the dense model's."""
        p = clip.check_norm_type(norm_type)
        if groups is not None and groups.dp is not self.comm:
            raise ValueError("clip_grad_norm_: groups.dp must be the communicator this "
                             "ZeroDataParallel runs over")
        self._finish()
        pieces = []
        for u in self.units:
            g = u.master.grad
            pieces.extend(g[a:b] for a, b in self._counted_ranges(u, groups))
        acc = clip.local_power(pieces, p, self.device)
        norm = clip.reduce_power(acc, p, clip.model_parallel_comms(groups, self.comm))
        coef = clip.clip_coefficient(norm, max_norm)
        if coef < 1.0:
            for u in self.units:
                u.master.grad.mul_(coef)
        return norm.to(torch.float32)[0]

    def _counted_ranges(self, u, groups):
        """The [a, b) ranges of this rank's shard of `u` that hold parameters this rank
        counts in the global norm (the padding past the last parameter is left out)."""
        ranges = []
        for o, n, q in zip(u.offsets, u.numels, u.params):
            a, b = max(o, u.lo), min(o + n, u.hi)
            if a < b and clip.counted_here(q, groups):
                if ranges and ranges[-1][1] == a - u.lo:
                    ranges[-1] = (ranges[-1][0], b - u.lo)
                else:
                    ranges.append((a - u.lo, b - u.lo))
        return ranges

    @torch.no_grad()
    def step(self):
        """Finishes the reductions, steps this rank's shards, and all-gathers the updated
        parameters (stages 1 and 2; stage 3 only refreshes its compute-dtype shard)."""
        self._finish()
        self.events.clear()
        self.optimizer.step()
        for u in self.units:
            u.master.grad = None
        self._publish()
        self._reduced = False

    @torch.no_grad()
    def _publish(self):
        if self.stage == 3:
            for u in self.units:
                if not u.shared_shard:
                    u.param_shard.copy_(u.master)
            return
        works = []
        for u in self.units:
            src = u.master.detach().to(self.compute_dtype)  # no copy without mixed precision
            works.append((self._all_gather(u.flat, src), src))
        for w, _ in works:
            w.wait()

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients: the full buffer under stage 1, the shards otherwise.
        set_to_none=True frees the stage 2 and 3 gradient shards instead (the first
        reduction of the next backward becomes the shard): less memory between steps
        than the paper's accounting, which the default keeps."""
        for u in self.units:
            if self.stage == 1:
                u.grad_full.zero_()
                for v, p in zip(u.grad_views, u.params):
                    p.grad = v
            else:
                if set_to_none:
                    u.grad_shard = None
                else:
                    u.grad_shard.zero_()
                for p in u.params:
                    p.grad = None
            u.master.grad = None
        self._reduced = False

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients in full, locally, without
        communication; the first synchronised backward after it reduces the sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # -- inspection -----------------------------------------------------------------
    def memory_bytes(self):
        """Bytes this rank holds in the layer's tensors right now (call between steps):
        params (full buffers, or the compute-dtype shards under stage 3), grads (full
        buffers under stage 1, shards otherwise), optimizer_state (fp32 masters where
        they are a separate copy, and the optimizer's state tensors), buffers (buckets
        and gathered copies in flight: 0 between steps), total, and peak_buffers: the most
        bytes of stage 2 and 3's buckets, reduce outputs and gathered copies alive at once
        since construction (bounded by two reduce_scatters in flight plus the buckets
        being filled; under stage 3 also by the module computing and the one prefetched)."""
        def size(t):
            return 0 if t is None else t.untyped_storage().nbytes()

        params = grads = opt = buffers = 0
        for u in self.units:
            if self.stage == 3:
                buffers += size(u.flat)
                params += size(u.param_shard)
            else:
                params += size(u.flat)
            grads += size(u.grad_full) + size(u.grad_shard)
            buffers += size(u.bucket) + (size(u.rs[1]) if u.rs else 0)
            if not u.shared_shard:
                opt += size(u.master)
            for v in self.optimizer.state.get(u.master, {}).values():
                if torch.is_tensor(v):
                    opt += size(v)
        return {"params": params, "grads": grads, "optimizer_state": opt, "buffers": buffers,
                "total": params + grads + opt + buffers, "peak_buffers": self._peak}

    @torch.no_grad()
    def _full(self, u, shard, dst=None):
        """The unit's padded full tensor from every rank's `shard` (None off dst)."""
        out = torch.empty(u.padded, dtype=shard.dtype, device=shard.device)
        if dst is None:
            self.comm.all_gather(out, shard.contiguous())
            return out
        self.comm.gather(out, shard.contiguous(), dst=dst)
        return out if self.rank == dst else None

    @torch.no_grad()
    def full_parameters(self):
        """Every parameter in module.parameters() order, gathered where sharded: the
        master values (fp32 under mixed precision), detached copies."""
        full = {}
        for u in self.units:
            flat = self._full(u, u.master.detach())
            for v, p in zip(u.views(flat), u.params):
                full[id(p)] = v.clone()
        return [full[id(p)] if id(p) in full else p.detach().clone() for p in self.module.parameters()]

    # -- checkpoints ----------------------------------------------------------------
    @torch.no_grad()
    def state_dict(self, mode="full", rank=0):
        """mode="full": on every rank {"model": the module's state dict with the master
        values, "optimizer": the optimizer's state dict as if it had been built over the
        trainable parameters in module.parameters() order}. "consolidated": the same
        gathered on `rank` only (None elsewhere). "sharded": this rank's shards, masters
        and optimizer state, loadable at the same world size and layout."""
        if mode not in _STATE_MODES:
            raise ValueError(f"mode must be one of {_STATE_MODES}, got {mode!r}")
        self._flush_quietly()
        if mode == "sharded":
            return {"zero_sharded": {"stage": self.stage, "world_size": self.world, "rank": self.rank,
                                     "layout": [(u.numel, u.shard) for u in self.units]},
                    "master": [u.master.detach().clone() for u in self.units],
                    "optimizer": copy.deepcopy(self.optimizer.state_dict()),  # a snapshot
                    "buffers": {n: b.detach().clone() for n, b in self.module.named_buffers()}}
        dst = rank if mode == "consolidated" else None
        values, opt_state = {}, {}
        index = {id(p): i for i, p in enumerate(self._params)}
        for u in self.units:
            flat = self._full(u, u.master.detach(), dst)
            state = self.optimizer.state.get(u.master, {})
            keys = sorted(state)
            gathered = {}
            for k in keys:
                v = state[k]
                if torch.is_tensor(v) and v.numel() == u.shard and v.dim() == 1:
                    gathered[k] = self._full(u, v, dst)
                elif torch.is_tensor(v) and v.numel() > 1:
                    raise ValueError(f"optimizer state {k!r} of shape {tuple(v.shape)} is not "
                                     f"element-wise; it cannot be consolidated")
                else:
                    gathered[k] = v
            if flat is None:
                continue
            for i, p in enumerate(u.params):
                o, n = u.offsets[i], u.numels[i]
                values[id(p)] = flat[o:o + n].view(p.shape).clone()
                if keys:
                    opt_state[index[id(p)]] = {
                        k: (g[o:o + n].view(p.shape).clone() if torch.is_tensor(g) and g.numel() == u.padded
                            else (g.clone() if torch.is_tensor(g) else g)) for k, g in gathered.items()}
        if dst is not None and self.rank != dst:
            return None
        model = {}
        for name, t in self.module.state_dict(keep_vars=True).items():
            model[name] = values[id(t)] if id(t) in values else t.detach().clone()
        group = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self._params)))
        return {"model": model, "optimizer": {"state": opt_state, "param_groups": [group]}}

    @torch.no_grad()
    def load_state_dict(self, state, src=None):
        """Loads what state_dict() returned: a full one (on every rank), a consolidated one
        (pass it on rank `src`, None on the others), or this rank's sharded one."""
        if src is not None:
            state = self._broadcast_object(state if self.rank == src else None, src)
        if not isinstance(state, dict):
            raise TypeError(f"expected a state dict, got {type(state).__name__}")
        if "zero_sharded" in state:
            meta = state["zero_sharded"]
            want = {"stage": self.stage, "world_size": self.world, "rank": self.rank,
                    "layout": [(u.numel, u.shard) for u in self.units]}
            got = {k: (list(map(tuple, v)) if k == "layout" else v) for k, v in meta.items()}
            if got != want:
                raise ValueError(f"sharded state of {({k: v for k, v in got.items() if k != 'layout'})} "
                                 f"does not fit this rank ({({k: v for k, v in want.items() if k != 'layout'})}"
                                 f"{'' if got.get('layout') == want['layout'] else ', other layout'})")
            for u, m in zip(self.units, state["master"]):
                u.master.copy_(m)
            self.optimizer.load_state_dict(state["optimizer"])
            for n, b in self.module.named_buffers():
                b.copy_(state["buffers"][n])
        elif "model" in state and "optimizer" in state:
            self._load_full(state)
        else:
            raise ValueError("not a ZeroDataParallel state dict (no 'zero_sharded', or "
                             "'model' and 'optimizer' keys)")
        self._publish()

    def _load_full(self, state):
        model = state["model"]
        tensors = self.module.state_dict(keep_vars=True)
        missing = [n for n in tensors if n not in model]
        if missing:
            raise ValueError(f"the state dict lacks {missing[:5]}")
        name_of = {}
        for n, t in tensors.items():
            name_of.setdefault(id(t), n)
        opt = state["optimizer"]
        per_param = opt.get("state", {})
        index = {id(p): i for i, p in enumerate(self._params)}
        inner = {"param_groups": [{**opt["param_groups"][0], "params": list(range(len(self.units)))}],
                 "state": {}}
        for j, u in enumerate(self.units):
            full = torch.zeros(u.padded, dtype=self.master_dtype, device=self.device)
            for v, p in zip(u.views(full), u.params):
                src = model[name_of[id(p)]]
                if src.shape != p.shape:
                    raise ValueError(f"{name_of[id(p)]}: shape {tuple(src.shape)}, expected {tuple(p.shape)}")
                v.copy_(src)
            u.master.copy_(full[u.lo:u.hi])
            idx = [index[id(p)] for p in u.params]
            if any(i in per_param for i in idx):
                st = {}
                for k, v0 in per_param[idx[0]].items():
                    if torch.is_tensor(v0) and v0.shape == u.params[0].shape and (
                            v0.dim() > 0 or k != "step"):
                        buf = torch.zeros(u.padded, dtype=v0.dtype, device=self.device)
                        for vv, i in zip(u.views(buf), idx):
                            vv.copy_(per_param[i][k])
                        st[k] = buf[u.lo:u.hi].clone()
                    else:
                        st[k] = v0.clone() if torch.is_tensor(v0) else v0
                inner["state"][j] = st
        self.optimizer.load_state_dict(inner)
        for n, b in self.module.named_buffers():
            b.copy_(model[n])

    def _broadcast_object(self, obj, src):
        from ringcomm.parallel.elastic import broadcast_object

        return broadcast_object(self.comm, obj, src)

    def _flush_quietly(self):
        if self.stage != 1 and any(u.rs for u in self.units):
            while self._in_flight:
                self._retire(self._in_flight.pop(0))

    def remove_hooks(self):
        for h in self._handles:
            h.remove()
        self._handles = []


def paper_memory_bytes(P, N, stage, K=12):
    """The paper's per-rank model-state bytes (section 5, mixed precision: 2-byte parameters
    and gradients, K bytes of optimizer state per parameter, K = 12 for Adam) as
    (params, grads, optimizer_state); stage 0 is replicated data parallelism."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (replicated), 1, 2 or 3, got {stage!r}")
    return (2 * P / (N if stage == 3 else 1), 2 * P / (N if stage >= 2 else 1),
            K * P / (N if stage >= 1 else 1))


def _cast(x, dtype):
    return x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x


def _first_grad_tensor(out):
    if torch.is_tensor(out):
        return out if out.requires_grad else None
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_grad_tensor(o)
            if t is not None:
                return t
    if isinstance(out, dict):
        for o in out.values():
            t = _first_grad_tensor(o)
            if t is not None:
                return t
    return None


__all__ = ["ZeroDataParallel", "paper_memory_bytes"]
