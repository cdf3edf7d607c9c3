"""3D training (TP x PP x DP) that goes on when a rank is lost: the lost rank's
whole model replica (its TP x PP group) is dropped, the other replicas continue.

    g = split_3d(world, tp=2, pp=2)
    ...build the stage, tensor_parallel(stage, g.tp), DataParallel(stage, g.dp),
       Pipeline(model, g.pp, ...), the optimizer...
    def compute(groups, tokens, targets, weight):    # this rank's share of the step
        losses = pipe.step(tokens, targets)             # loss_fn scaled by `weight`
        model.finish()                                  # the DP reduction
        return (sum(losses) / len(losses) / weight) if pipe.is_last else None
    el = Elastic3D(world, g, compute, opt.step, batch_of, parts=[model, pipe])
    while el.step < steps:
        loss = el.train_step()

Each step, every replica trains on its DP rank's contiguous share of the
step's global batch (`batch_of(step)`, the same on every rank);
`compute(groups, *share, weight=share * dp_size)` runs its forward and
backward (scaling its loss by `weight`, so that the DP average is the global
batch's gradient whatever the number of replicas) and finishes the DP
reduction, returning the share's mean loss on the last stage (None elsewhere).
Then one all_reduce over the world carries the losses: it is the step's commit
point. A rank that gets through it knows that every rank of the world had
finished its reductions, so once any rank committed a step, every survivor
holds that step's reduced gradients. Then `optimizer_step()` runs.

When a call fails, every live rank calls drop_lost_replicas (revoke the
groups and the world, agree on who is gone, drop each lost rank's replica,
shrink, split_3d again with the same TP and PP coordinates). A rank of a
dropped replica gets ReplicaDropped (a RingcommError: it leaves the job). The
others agree over the new world on the newest step any of them committed; a
rank whose commit failed where another's completed applies its reduced
gradients then (so every survivor keeps that step), and otherwise every
survivor redoes the step in progress on the new world's shares. Before going
on, the communicators held by `parts` (nn.Modules, walked with .modules(),
and any object with a .comm: a Pipeline) are replaced by the new groups' (a
TP layer's old TP communicator by the new TP one, and so on), and
DataParallel's reductions in flight are forgotten (reset()). The parameters
and optimizer state stay where they are: every surviving rank keeps its
stage and shard of the model, and the surviving replicas are in step.
`recoveries` lists each recovery.
"""
import collections
import time

import torch
import torch.nn as nn

from ringcomm.errors import RingcommError
from ringcomm.parallel.elastic import retry_step, share
from ringcomm.parallel.mesh import drop_lost_replicas


class ReplicaDropped(RingcommError):
    """This rank's replica lost a rank and was dropped from the job."""


class Elastic3D:
    """Drives 3D training steps and drops the replicas of lost ranks (see the module docstring).

    Args:
        world: the communicator `groups` was split from (split_3d(world, ...)).
        groups: this rank's ParallelGroups.
        compute: (groups, *share, weight) -> the share's mean loss on the last
            pipeline stage (None elsewhere); runs forward, backward and the DP
            reduction of this rank's share of the step.
        optimizer_step: () -> None; applies the reduced gradients (and zeroes them,
            or compute does).
        batch_of: step -> the global batch of that step (a tensor or a tuple of
            tensors, batch first), the same on every rank.
        parts: the objects holding this rank's communicators (the TP-sharded
            module, the DataParallel, the Pipeline): their .comm attributes are
            moved to the new groups after a recovery.
        timeout: seconds each recovery may take (default: the communicators').
    """

    def __init__(self, world, groups, compute, optimizer_step, batch_of, parts=(), timeout=None):
        from ringcomm.parallel.zero import ZeroDataParallel

        for part in parts:
            if any(isinstance(o, ZeroDataParallel) for o in (part.modules() if isinstance(part, nn.Module)
                                                             else [part])):
                raise ValueError("Elastic3D drops whole replicas, and ZeroDataParallel keeps each DP "
                                 "rank's shards on that rank only: a dropped replica would take them "
                                 "with it (use DataParallel over the DP group)")
        self.world, self.groups = world, groups
        self.compute, self.optimizer_step, self.batch_of = compute, optimizer_step, batch_of
        self.parts = list(parts)
        self.timeout = timeout
        self.step = 0          # steps completed
        self.committed = 0     # steps this rank got through the commit of
        self.recoveries = []
        # (step, global loss) of the last completed steps, a step kept during a recovery
        # included (train_step returns only the step it completed last)
        self.history = collections.deque(maxlen=1024)
        self._last_loss = float("nan")

    def train_step(self):
        """Runs step `self.step` and returns its global mean loss (every rank)."""
        return retry_step(self._attempt, self._recover, lambda: self.step, final=ReplicaDropped)

    def _attempt(self):
        g = self.groups
        mine, frac = share(self.batch_of(self.step), g.dp_rank, g.dp_size)
        loss = self.compute(g, *mine, weight=frac * g.dp_size)
        total = torch.zeros(1, dtype=torch.float64)
        if loss is not None and g.tp_rank == 0:  # one rank per last stage of each replica
            total[0] = float(loss) * frac
        self._commit(total)
        self.committed = self.step + 1
        self._last_loss = float(total[0])
        self.optimizer_step()
        self.step += 1
        self.history.append((self.step - 1, self._last_loss))
        return self._last_loss

    def _commit(self, total):
        self.world.all_reduce(total)

    def _recover(self, error):
        t0 = time.monotonic()
        old_world, old = self.world, self.groups
        for part in self.parts:
            for obj in _holders_of_comms(part):
                if hasattr(obj, "reset"):
                    obj.reset()
        new_world, ng = drop_lost_replicas(old_world, old, timeout=self.timeout)
        if new_world is None:
            old_world.close()
            raise ReplicaDropped(f"ringcomm: this rank's model replica lost a rank and was dropped "
                                 f"(after: {str(error)[:200]})")
        lost = sorted(set(range(old_world.world_size)) - set(new_world.parent_ranks))
        old_world.close()
        newest = torch.tensor([self.committed], dtype=torch.int64)
        new_world.all_reduce(newest, op="max")
        # the newest committed step's loss, from a rank that got through its commit
        loss = torch.tensor([self._last_loss if self.committed == int(newest) else float("-inf")],
                            dtype=torch.float64)
        new_world.all_reduce(loss, op="max")
        kept = False
        if int(newest) > self.committed:  # committed elsewhere: this rank holds the reduced gradients
            self.optimizer_step()
            self.committed = int(newest)
            self._last_loss = float(loss)
            self.history.append((self.committed - 1, self._last_loss))
            kept = True
        self.step = int(newest)
        mapping = {id(old.tp): ng.tp, id(old.pp): ng.pp, id(old.dp): ng.dp}
        for part in self.parts:
            for obj in _holders_of_comms(part):
                if id(obj.comm) in mapping:
                    obj.comm = mapping[id(obj.comm)]
        self.world, self.groups = new_world, ng
        self.recoveries.append({"step": self.step, "lost": lost, "world": new_world.world_size,
                                "dp": ng.dp_size, "kept": kept, "total_s": time.monotonic() - t0,
                                "error": str(error)[:300]})


def _holders_of_comms(part):
    objs = list(part.modules()) if isinstance(part, nn.Module) else [part]
    return [o for o in objs if getattr(o, "comm", None) is not None]


__all__ = ["Elastic3D", "ReplicaDropped"]
