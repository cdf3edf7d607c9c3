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

A replacement process calls ElasticDataParallel.join(model, optimizer,
batch_of, store=..., job=...); the members (built with job=...) admit it at
the end of a step (comm.grow), send it parameters, buffers, optimizer state
and the step count from their rank 0, and the next step is shared over the
grown world.
"""
import io
import time

import torch

from ringcomm.errors import RingcommError
from ringcomm.parallel.dp import DataParallel

MAX_RECOVERIES_PER_STEP = 8


def retry_step(attempt, recover, step_of, final=()):
    """attempt(); after a RingcommError (but one of `final`), recover(error) and
    attempt again, at most MAX_RECOVERIES_PER_STEP times: the loop of every
    elastic driver's train_step."""
    for _ in range(MAX_RECOVERIES_PER_STEP):
        try:
            return attempt()
        except final:
            raise
        except RingcommError as e:
            recover(e)
    raise RingcommError(f"ringcomm: step {step_of()} failed {MAX_RECOVERIES_PER_STEP} times in a row")


def revoke_and_shrink(old, error, timeout):
    """Revokes `old` (every rank's calls on it stop), shrinks it to the survivors and
    closes it; returns (the survivors' communicator, the old ranks that are gone)."""
    try:
        old.revoke(f"recovering from: {str(error)[:200]}")
    except RingcommError:
        pass  # already closed
    new = old.shrink(timeout=timeout)
    lost = [r for r in range(old.world_size) if r not in new.parent_ranks]
    old.close()
    return new, lost


def loss_and_joiners(comm, loss, frac, job):
    """One all_reduce of [this rank's share of the step's loss, and (rank 0's
    look into the store, with job set) how many replacements wait to join]:
    every rank learns the global loss and admits at the same step."""
    total = torch.zeros(2, dtype=torch.float64)
    total[0] = float(loss.detach()) * frac
    if job is not None and comm.rank == 0:
        from ringcomm import recovery

        total[1] = recovery.waiting(comm._store, job)
    comm.all_reduce(total)
    return total


def _as_tuple(batch):
    return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)


def share(batch, rank, world):
    """Rank `rank`'s contiguous share of a global batch, and its fraction."""
    parts = _as_tuple(batch)
    n = parts[0].shape[0]
    mine = tuple(torch.tensor_split(p, world)[rank] for p in parts)
    return mine, mine[0].shape[0] / n


def broadcast_object(comm, obj, root, weights_only=False):
    """root's `obj` (anything torch.save takes) on every rank of comm; the others
    pass None. weights_only=True loads with torch's restricted unpickler."""
    size = torch.zeros(1, dtype=torch.int64)
    if comm.rank == root:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size[0] = data.numel()
    comm.broadcast(size, root)
    if comm.rank != root:
        data = torch.empty(int(size), dtype=torch.uint8)
    comm.broadcast(data, root)
    if comm.rank == root:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=weights_only)


def broadcast_training_state(comm, optimizer, step, root):
    """Every rank's optimizer state and step count <- root's; returns the step."""
    n = torch.tensor([step], dtype=torch.int64)
    comm.broadcast(n, root)
    state = broadcast_object(comm, optimizer.state_dict() if comm.rank == root else None, root,
                             weights_only=True)
    if comm.rank != root:
        optimizer.load_state_dict(state)
    return int(n)


class ElasticDataParallel:
    """Drives DataParallel training steps and recovers from lost ranks (see the module docstring).

    Args:
        dp: a ringcomm.parallel.DataParallel (its communicator is replaced on recovery).
        optimizer: over dp's parameters.
        batch_of: step -> the global batch of that step.
        timeout: seconds each recovery's agreement and shrink may take (default: the
            communicator's timeout).
        job: admit replacements that wait in ElasticDataParallel.join(job=...) (or
            ringcomm.init(join=job)) at the end of each step (None: never). Rank 0
            looks in the store once a step; the answer rides on the step's loss
            reduction, so every rank admits at the same step.
    """

    def __init__(self, dp, optimizer, batch_of, timeout=None, job=None):
        self.dp = dp
        self.optimizer = optimizer
        self.batch_of = batch_of
        self.timeout = timeout
        self.job = job
        self.step = 0  # steps completed
        self.last_world = None  # how many ranks shared the last completed step
        self.recoveries = []

    @classmethod
    def join(cls, module, optimizer, batch_of, store=None, job="default", timeout=None, **dp_kwargs):
        """A replacement's side: waits until the members admit it (at the end of
        one of their steps), takes its parameters, buffers, optimizer state and
        step count from their rank 0, and returns its ElasticDataParallel, which
        goes on with the members' next step (and admits later joiners too)."""
        from ringcomm.collectives import init

        comm = init(join=job, store=store, timeout=timeout)
        dp = DataParallel(module, comm, **dp_kwargs)  # its broadcast is the members' resync()
        el = cls(dp, optimizer, batch_of, timeout=timeout, job=job)
        el.step = broadcast_training_state(comm, optimizer, 0, 0)
        return el

    @property
    def comm(self):
        return self.dp.comm

    def train_step(self, loss_fn):
        """Runs step `self.step` on this rank's share of its global batch and returns
        the global loss of the step it completed, which is `self.step - 1`
        afterwards. A rank is lost meanwhile: recovers, and redoes the step in
        progress; a survivor that was behind then completes the step after
        the one it began (its own step was completed by the others)."""
        return retry_step(lambda: self._attempt(loss_fn), self._recover, lambda: self.step)

    def _attempt(self, loss_fn):
        comm = self.dp.comm
        mine, frac = share(self.batch_of(self.step), comm.rank, comm.world_size)
        self.optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(self.dp, *mine)
        # AVG over the ranks of (loss x share x world) = the global batch's mean.
        (loss * (frac * comm.world_size)).backward()
        self.dp.finish()
        total = loss_and_joiners(comm, loss, frac, self.job)
        self.optimizer.step()  # nothing can fail after this: the step is complete here
        self.step += 1
        self.last_world = comm.world_size
        if total[1] > 0:
            self._admit()
        return float(total[0])

    def _admit(self):
        """At a step boundary: grow the communicator by the waiting replacements
        and hand them the state. A failure here is recovered like any other."""
        t0 = time.monotonic()
        old = self.dp.comm
        try:
            new = old.grow(job=self.job, timeout=self.timeout)
        except (RingcommError, ValueError) as e:  # a joiner that failed: the members go on without it
            self.recoveries.append({"step": self.step, "joined": [], "world": old.world_size,
                                    "error": str(e)[:300], "total_s": time.monotonic() - t0})
            return
        if new is old:
            return
        old.close()
        self.dp.comm = new
        self.dp.reset()
        self.dp.resync(0)
        broadcast_training_state(new, self.optimizer, self.step, 0)
        self.recoveries.append({"step": self.step, "lost": [], "joined": list(range(old.world_size, new.world_size)),
                                "world": new.world_size, "state_sent": True, "shrink_s": 0.0,
                                "total_s": time.monotonic() - t0})

    def _recover(self, error):
        t0 = time.monotonic()
        old = self.dp.comm
        self.dp.reset()
        new, lost = revoke_and_shrink(old, error, self.timeout)
        t_shrink = time.monotonic()
        self.dp.comm = new
        done = torch.tensor([self.step], dtype=torch.int64)
        new.all_reduce(done, op="max")
        latest = int(done)
        first = torch.tensor([new.rank if self.step == latest else new.world_size], dtype=torch.int64)
        new.all_reduce(first, op="min")
        behind = torch.tensor([int(self.step < latest)], dtype=torch.int64)
        new.all_reduce(behind, op="max")
        if int(behind):
            self.dp.resync(int(first))
            broadcast_training_state(new, self.optimizer, self.step, int(first))
        self.step = latest
        self.recoveries.append({
            "step": latest, "lost": lost, "joined": [], "world": new.world_size, "state_sent": bool(int(behind)),
            "shrink_s": t_shrink - t0, "total_s": time.monotonic() - t0, "error": str(error)[:300],
        })
