"""Data parallelism: gradients averaged in buckets that are reduced during backward.

Parameters are grouped, in reverse registration order (roughly the order backward
produces their gradients) and per dtype, into buckets of at most bucket_cap_mb.
Each bucket owns one flat contiguous buffer, and each parameter's .grad becomes a
view into it, so gradients accumulate in place and a bucket is reduced without
packing. A post-accumulate-grad hook marks a parameter ready; when every parameter
of a bucket is ready its all_reduce (AVG) is issued asynchronously, and runs on the
communicator's worker thread while autograd computes the remaining gradients.

Buckets are issued strictly in bucket order, so every rank issues the same sequence
of collectives even where hooks fire in a different order. finish() (or the
optimizer step, see attach_optimizer) issues buckets that never became ready (unused
parameters count as zero gradients) and waits for all of them.

The hooks hold the wrapper weakly (parallel/hooks.py): it is freed, with its buckets,
when its last reference goes, and from then on the module's gradients are no longer
reduced. Keep the wrapper (as torch's DistributedDataParallel) while training through it.
"""
import contextlib
from collections import defaultdict

import torch
import torch.nn as nn

from ringcomm.parallel.hooks import weak_hook


class _Bucket:
    __slots__ = ("index", "params", "views", "flat", "ready", "work")

    def __init__(self, index, params):
        self.index = index
        self.params = params
        p0 = params[0]
        total = sum(p.numel() for p in params)
        self.flat = torch.zeros(total, dtype=p0.dtype, device=p0.device)
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.ready = set()  # indices into params
        self.work = None


@torch.no_grad()
def broadcast_tensors(comm, tensors, root=0):
    """Every rank's `tensors` <- root's, in one broadcast per (dtype, device)."""
    if comm.world_size == 1:
        return
    groups = defaultdict(list)
    for t in tensors:
        groups[(t.dtype, t.device)].append(t)
    for ts in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        comm.broadcast(flat, root)
        offset = 0
        for t in ts:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


class DataParallel(nn.Module):
    """Wraps `module` so that backward averages its gradients over `comm`.

    Args:
        module: the replica on this rank (its parameters are overwritten by rank 0's).
        comm: a ringcomm Communicator over the data-parallel ranks.
        bucket_cap_mb: largest bucket, in MiB.
        overlap: False issues every all_reduce in finish(), after backward (the
            baseline the benchmark compares with).
        broadcast_buffers: also broadcast the module's buffers at wrap time.

    After backward call finish() (or attach_optimizer(opt) once) before reading the
    gradients. Inside ``with dp.no_sync():`` gradients only accumulate locally.
    zero_grad(set_to_none=False) keeps the gradients in the buckets; after
    set_to_none=True each new gradient is copied in once.
    """

    def __init__(self, module, comm, bucket_cap_mb=25, overlap=True, broadcast_buffers=True):
        super().__init__()
        self.module = module
        self.comm = comm
        self.overlap = overlap
        self._sync = True
        self._cap = max(1, int(bucket_cap_mb * 2 ** 20))
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = self._make_buckets(params)
        self._where = {}  # id(param) -> (bucket, position)
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self._where[id(p)] = (b, i)
        self._next = 0  # next bucket to issue
        self._pending = False  # an iteration's reduction started and was not finished
        self.events = []  # this iteration: ("grad", name) and ("launch", bucket index)
        self._names = {id(p): n for n, p in module.named_parameters()}
        self.broadcast_buffers = broadcast_buffers
        self.resync()
        self._handles = [p.register_post_accumulate_grad_hook(weak_hook(self._on_grad)) for p in params]

    # -- set-up -----------------------------------------------------------------
    def _make_buckets(self, params):
        open_by_kind, buckets = {}, []
        for p in reversed(params):
            kind = (p.dtype, p.device)
            cur = open_by_kind.get(kind)
            nbytes = p.numel() * p.element_size()
            if cur is None or (cur[1] + nbytes > self._cap and cur[0]):
                cur = open_by_kind[kind] = ([], 0)
                buckets.append(cur[0])
            cur[0].append(p)
            open_by_kind[kind] = (cur[0], cur[1] + nbytes)
        return [_Bucket(i, ps) for i, ps in enumerate(buckets)]

    def resync(self, root=0):
        """Every rank's parameters (and buffers, with broadcast_buffers) <- root's:
        what wrapping does (with root 0), and what a rank that joins or lags
        behind needs (ElasticDataParallel)."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        buffers = list(self.module.buffers()) if self.broadcast_buffers else []
        broadcast_tensors(self.comm, params + buffers, root)

    # -- backward ---------------------------------------------------------------
    def _on_grad(self, p):
        bucket, i = self._where[id(p)]
        if not self._pending:
            self._pending = True
            self.events = []
        self.events.append(("grad", self._names.get(id(p), "?")))
        if bucket.work is not None:
            raise RuntimeError(
                "ringcomm.parallel.DataParallel: a gradient arrived for a bucket whose all_reduce "
                "is in flight; call finish() after each backward (or use no_sync() to accumulate)")
        self._adopt(p, bucket.views[i])
        if not self._sync:
            return
        bucket.ready.add(i)
        if self.overlap:
            self._issue_ready()

    @staticmethod
    def _adopt(p, view):
        """Makes p.grad the bucket view (copying a freshly created grad into it)."""
        g = p.grad
        if g is None:
            view.zero_()
        elif g.data_ptr() != view.data_ptr() or g.shape != view.shape:
            view.copy_(g)
        else:
            return
        p.grad = view

    def _issue_ready(self):
        while self._next < len(self.buckets) and len(self.buckets[self._next].ready) == len(
                self.buckets[self._next].params):
            self._issue(self.buckets[self._next])

    def _issue(self, bucket):
        bucket.work = self.comm.all_reduce(bucket.flat, op="avg", async_op=True)
        self.events.append(("launch", bucket.index))
        self._next += 1

    def finish(self):
        """Issues the buckets not issued yet and waits for every reduction; afterwards
        each parameter's .grad is the average over the ranks. No-op when nothing is
        pending (e.g. after a backward under no_sync())."""
        if not self._pending or not self._sync:
            return
        try:
            for b in self.buckets[self._next:]:
                for i, p in enumerate(b.params):
                    if i not in b.ready:  # not used this iteration: contributes its current grad or 0
                        self._adopt(p, b.views[i])
                self._issue(b)
            for b in self.buckets:
                b.work.wait()
        finally:
            for b in self.buckets:
                b.ready.clear()
                b.work = None
            self._next = 0
            self._pending = False

    def reset(self):
        """Forgets the reductions in flight (their communicator failed): the
        next backward starts afresh. Used by ElasticDataParallel on recovery,
        before dp.comm is replaced."""
        for b in self.buckets:
            b.ready.clear()
            b.work = None
        self._next = 0
        self._pending = False

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, without communication;
        the first synchronised backward after it averages the accumulated sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old
            if self._sync:
                self._pending = False

    def attach_optimizer(self, optimizer):
        """Makes optimizer.step() call finish() first. Returns the hook handle."""
        return optimizer.register_step_pre_hook(lambda *_: self.finish())

    def forward(self, *args, **kwargs):
        if self._pending and self._sync:
            self.finish()  # the last backward's reductions must land before new gradients
        return self.module(*args, **kwargs)

    def remove_hooks(self):
        for h in self._handles:
            h.remove()
        self._handles = []
