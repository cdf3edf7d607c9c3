"""Training that survives the loss of data-parallel ranks (DataParallel).

    el = ElasticDataParallel(DataParallel(model, comm), optimizer, batch_of)
    while el.step < steps:
        loss = el.train_step(loss_fn)      # loss_fn(model, *shard) -> mean loss of the shard

`batch_of(step)` gives the global batch of a step (a tensor or a tuple of
tensors, batch first), the same on every rank; each rank trains on its
contiguous share of it (torch.tensor_split over the current world), its loss
weighted by its share, so that the averaged gradient is that of the global
batch whatever the number of ranks. The step's global loss is returned.

When a call fails (a rank was lost), the survivors recover in place:
revoke the DP communicator, shrink it (ringcomm/recovery.py: agree on who is
gone, build the survivors' communicator), then agree over the new one on the
last step any survivor completed. A survivor behind it (its reduction failed
where another's had just completed) receives parameters, buffers and
optimizer state from the lowest rank that completed it, and every survivor
redoes the step in progress on the new world's shares. So every survivor
keeps or redoes each step alike, no completed step is lost, and the loss of
each step is the fault-free run's (up to the summation order of the
reductions). `recoveries` lists each recovery: who was lost and how long
the phases took.
"""
import io
import time

import torch

from ringcomm.errors import RingcommError
from ringcomm.parallel.dp import broadcast_tensors

MAX_RECOVERIES_PER_STEP = 8


def _as_tuple(batch):
    return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)


def share(batch, rank, world):
    """Rank `rank`'s contiguous share of a global batch, and its fraction."""
    parts = _as_tuple(batch)
    n = parts[0].shape[0]
    mine = tuple(torch.tensor_split(p, world)[rank] for p in parts)
    return mine, mine[0].shape[0] / n


def broadcast_state(comm, module, optimizer, root):
    """Every rank's parameters, buffers and optimizer state <- root's."""
    broadcast_tensors(comm, [p.data for p in module.parameters()] + list(module.buffers()), root)
    if optimizer is None:
        return
    if comm.rank == root:
        buf = io.BytesIO()
        torch.save(optimizer.state_dict(), buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    comm.broadcast(size, root)
    if comm.rank != root:
        data = torch.empty(int(size), dtype=torch.uint8)
    comm.broadcast(data, root)
    if comm.rank != root:
        optimizer.load_state_dict(torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True))


class ElasticDataParallel:
    """Drives DataParallel training steps and recovers from lost ranks (see the module docstring).

    Args:
        dp: a ringcomm.parallel.DataParallel (its communicator is replaced on recovery).
        optimizer: over dp's parameters.
        batch_of: step -> the global batch of that step.
        timeout: seconds each recovery's agreement and shrink may take (default: the
            communicator's timeout).
    """

    def __init__(self, dp, optimizer, batch_of, timeout=None):
        self.dp = dp
        self.optimizer = optimizer
        self.batch_of = batch_of
        self.timeout = timeout
        self.step = 0  # steps completed
        self.recoveries = []

    @property
    def comm(self):
        return self.dp.comm

    def train_step(self, loss_fn):
        """Runs step `self.step` on this rank's share of its global batch and returns
        the global loss of the step it completed, which is `self.step - 1`
        afterwards. A rank is lost meanwhile: recovers, and redoes the step in
        progress; a survivor that was behind then completes the step after
        the one it began (its own step was completed by the others)."""
        for _ in range(MAX_RECOVERIES_PER_STEP):
            try:
                return self._attempt(loss_fn)
            except RingcommError as e:
                self._recover(e)
        raise RingcommError(f"ringcomm: step {self.step} failed {MAX_RECOVERIES_PER_STEP} times in a row")

    def _attempt(self, loss_fn):
        comm = self.dp.comm
        mine, frac = share(self.batch_of(self.step), comm.rank, comm.world_size)
        self.optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(self.dp, *mine)
        # AVG over the ranks of (loss x share x world) = the global batch's mean.
        (loss * (frac * comm.world_size)).backward()
        self.dp.finish()
        total = (loss.detach() * frac).reshape(1).to(torch.float64)
        comm.all_reduce(total)
        self.optimizer.step()  # nothing can fail after this: the step is complete here
        self.step += 1
        return float(total)

    def _recover(self, error):
        t0 = time.monotonic()
        old = self.dp.comm
        self.dp.reset()
        try:
            old.revoke(f"recovering from: {str(error)[:200]}")
        except RingcommError:
            pass  # already closed
        new = old.shrink(timeout=self.timeout)
        t_shrink = time.monotonic()
        lost = [r for r in range(old.world_size) if r not in new.parent_ranks]
        old.close()
        self.dp.comm = new
        done = torch.tensor([self.step], dtype=torch.int64)
        new.all_reduce(done, op="max")
        latest = int(done)
        first = torch.tensor([new.rank if self.step == latest else new.world_size], dtype=torch.int64)
        new.all_reduce(first, op="min")
        behind = torch.tensor([int(self.step < latest)], dtype=torch.int64)
        new.all_reduce(behind, op="max")
        if int(behind):
            broadcast_state(new, self.dp.module, self.optimizer, int(first))
        self.step = latest
        self.recoveries.append({
            "step": latest, "lost": lost, "world": new.world_size, "state_sent": bool(int(behind)),
            "shrink_s": t_shrink - t0, "total_s": time.monotonic() - t0, "error": str(error)[:300],
        })
