"""ZeRO training that survives the loss of data-parallel ranks: each rank's shards
are kept, in memory, on its ring successor too (the in-memory redundancy Gemini
(Wang et al., SOSP 2023) keeps for checkpoints).

    z = ZeroDataParallel(model, comm, stage=3, optimizer_class=torch.optim.AdamW, lr=1e-3)
    el = ElasticZeroDataParallel(z, batch_of)
    while el.step < steps:
        loss = el.train_step(loss_fn)      # loss_fn(z, *shard) -> mean loss of the shard
    el.zero                                # the layer now in use (rebuilt after a loss)

`batch_of(step)` and the shares of the global batch work as in
ElasticDataParallel: whatever the world, each step trains on the same global
batch, so the losses are the fault-free run's.

Redundancy. A rank's shard state is everything of the model that lives only on
that rank: per unit, its master shard (the parameters, fp32 under mixed
precision) and the optimizer's element-wise state of it (Adam's moments,
SGD's momentum). At the end of every step (and once at construction) each
rank packs its shard state into one byte buffer, keeps it (its snapshot of that
step) and sends it to rank r+1 while receiving rank r-1's (one sendrecv around
the ring: the step's all_reduce volume plus one shard state). Gradients need no
copy: a step boundary has none (a step in progress is redone, see below).

Two generations of both are kept, because a fault can cut the exchange: a rank
that finished exchange k has seen every rank enter step k's reductions, so no
survivor is more than one generation behind another. The memory this costs per
rank is 4 x its shard state (redundancy_bytes()): with AdamW, in fp32 or under
mixed precision, 4 x 12 P / N bytes (master 4 + two moments 8 per parameter; a
master that is no copy of its own is snapshotted all the same), against ZeRO
stage 3's own 16 P / N of model state.

A second loss while the survivors re-shard (below) ends in a RingcommError on
every survivor rather than a second recovery.

Recovery. A call fails (a rank was lost): the survivors revoke the communicator,
shrink it (ringcomm/recovery.py: agree on who is gone), and agree (minimum over
the survivors) on the last generation G every one of them finished exchanging.
Each old rank's shard state of generation G comes from itself, if it survived,
or from its successor's copy; if that successor was lost too, every survivor
raises the same RingcommError naming both ranks (the state is gone: restart
from a checkpoint). Every holder broadcasts each state it holds over the new
communicator, each survivor keeps the slices of its new shards (the units are
re-cut for the new world: same flat order, new padding), builds a fresh
ZeroDataParallel over the same module (same arguments, ZeroDataParallel.config)
and loads them, and the exchange runs once over the new world before training
resumes at step G. So every survivor rolls back alike: steps after G (at most
the one in progress) are redone on the new world's shares, and each step's loss
is the fault-free run's up to the summation order of the reductions.
`recoveries` lists each recovery: who was lost, the generation rolled back to,
and how long it took.

Limits: the layer must be a pure DP group (no tp_comm: under 3D use
drop_lost_replicas, which drops a replica whole); an LR scheduler is bound to
the old optimizer (read el.zero.optimizer after a recovery and rebuild it:
the param group's hyper-parameters, lr included, are restored from G); the
re-shard broadcasts every old shard state to every survivor (each receives the
whole model state once, one old shard at a time; a point-to-point re-shard would
move 1/N of it).

Replacements. With job=..., rank 0 asks the store once a step whether
processes wait in ElasticZeroDataParallel.join(module, batch_of, job=...)
(the answer rides on the step's loss reduction); they are admitted at the
step's end (comm.grow), receive the members' ZeroDataParallel arguments, and
the state of that step is re-cut for the grown world the same way, each member
sending its own snapshot. The joiner's own parameter values do not matter.
"""
import copy
import time

import torch

from ringcomm.errors import RingcommError
from ringcomm.parallel.elastic import broadcast_object, loss_and_joiners, retry_step, revoke_and_shrink, share
from ringcomm.parallel.zero import ZeroDataParallel

GENERATIONS = 2


class ElasticZeroDataParallel:
    """Drives ZeroDataParallel training steps, keeps each rank's shards on its ring
    successor, and re-shards over the survivors when ranks are lost (see the
    module docstring).

    Args:
        zero: a ringcomm.parallel.ZeroDataParallel over the data-parallel ranks
            (replaced, with its optimizer, on recovery: read `el.zero`).
        batch_of: step -> the global batch of that step, the same on every rank.
        timeout: seconds each recovery's agreement and shrink may take (default:
            the communicator's timeout).
        job: admit replacements that wait in ElasticZeroDataParallel.join(job=...)
            at the end of each step (None: never); as in ElasticDataParallel, rank
            0 looks once a step and the answer rides on the step's loss reduction.
    """

    def __init__(self, zero, batch_of, timeout=None, job=None, _step=0):
        if not isinstance(zero, ZeroDataParallel):
            raise TypeError(f"expected a ZeroDataParallel, got {type(zero).__name__}")
        if zero.config.get("tp_comm") is not None:
            raise ValueError("ElasticZeroDataParallel recovers a pure data-parallel group; with a "
                             "tensor-parallel group (tp_comm) a lost rank takes its replica with it: "
                             "use ringcomm.parallel.drop_lost_replicas")
        self.zero = zero
        self.batch_of = batch_of
        self.timeout = timeout
        self.job = job
        self.step = _step        # steps completed
        self.last_world = None   # how many ranks shared the last completed step
        self.exchanged = None    # the newest generation this rank finished exchanging
        self.recoveries = []
        self._gens = {}          # generation -> _Generation
        self._protect(_step)

    @classmethod
    def join(cls, module, batch_of, store=None, job="default", timeout=None, token=None):
        """A replacement's side: waits until the members admit it (at the end of one
        of their steps), builds its ZeroDataParallel over the grown world with the
        members' arguments (stage, optimizer, mixed precision...), takes its shards
        of their state (each member sends its own), and returns its
        ElasticZeroDataParallel, which goes on with the members' next step."""
        from ringcomm.collectives import init

        # A process's first torch optimizer costs ~2 s of torch's lazy imports (seen on a
        # 2-core host): pay it before joining, not while the members wait in the re-shard.
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
        comm = init(join=job, store=store, timeout=timeout, token=token)
        meta = broadcast_object(comm, None, 0)
        z = _reshard(module, [p for p in module.parameters() if p.requires_grad], meta, comm,
                     mine=lambda r: None, holder_of=lambda r: r)
        el = cls(z, batch_of, timeout=timeout, job=job, _step=meta["step"])
        el.recoveries.append({"step": meta["step"], "lost": [], "joined": [comm.rank], "world": comm.world_size})
        return el

    @property
    def comm(self):
        return self.zero.comm

    # -- redundancy -------------------------------------------------------------
    def _protect(self, gen):
        """Snapshots this rank's shard state as generation `gen` and swaps copies
        with the ring neighbours (sends to r+1, receives r-1's)."""
        comm = self.zero.comm
        snap = _Generation.pack(self.zero)
        if comm.world_size > 1:
            snap.held = torch.empty_like(snap.own)
            comm.sendrecv(snap.own, (comm.rank + 1) % comm.world_size,
                          snap.held, (comm.rank - 1) % comm.world_size)
        self._gens[gen] = snap
        for g in [g for g in self._gens if g <= gen - GENERATIONS]:
            del self._gens[g]
        self.exchanged = gen

    def redundancy_bytes(self):
        """Bytes this rank spends on redundancy now: its own snapshots, the copies
        of its predecessor's state it holds, their total, and (for scale) the
        layer's own memory_bytes()["total"]."""
        own = sum(g.own.numel() for g in self._gens.values())
        held = sum(g.held.numel() for g in self._gens.values() if g.held is not None)
        return {"snapshots": own, "copies": held, "total": own + held,
                "generations": len(self._gens), "model_state": self.zero.memory_bytes()["total"]}

    # -- training -----------------------------------------------------------------
    def train_step(self, loss_fn):
        """Runs step `self.step` on this rank's share of its global batch and returns
        the step's global loss. A rank is lost meanwhile: recovers (rolling back
        to the last generation every survivor has) and redoes the steps since."""
        return retry_step(lambda: self._attempt(loss_fn), self._recover, lambda: self.step)

    def _attempt(self, loss_fn):
        z = self.zero
        comm = z.comm
        mine, frac = share(self.batch_of(self.step), comm.rank, comm.world_size)
        z.zero_grad()
        loss = loss_fn(z, *mine)
        # AVG over the ranks of (loss x share x world) = the global batch's mean.
        (loss * (frac * comm.world_size)).backward()
        z.step()
        total = loss_and_joiners(comm, loss, frac, self.job)
        self._protect(self.step + 1)
        self.step += 1
        self.last_world = comm.world_size
        if total[1] > 0:
            self._admit()
        return float(total[0])

    def _admit(self):
        """At a step boundary (its generation just exchanged): grow the
        communicator by the waiting replacements and re-shard the state over the
        grown world, each member sending its own shards. A failure here is
        recovered like any other (the members roll back to this generation)."""
        t0 = time.monotonic()
        old_z = self.zero
        old = old_z.comm
        try:
            new = old.grow(job=self.job, timeout=self.timeout)
        except (RingcommError, ValueError) as e:  # a joiner that failed: the members go on without it
            self.recoveries.append({"step": self.step, "lost": [], "joined": [], "world": old.world_size,
                                    "error": str(e)[:300], "total_s": time.monotonic() - t0})
            return
        if new is old:
            return
        t_grow = time.monotonic()
        snap = self._gens[self.step]
        try:
            meta = broadcast_object(new, _meta(old_z, snap, self.step) if new.rank == 0 else None, 0)
            old_z.remove_hooks()
            z = _reshard(old_z.module, old_z._params, meta, new,
                         mine=lambda r: snap.own if r == old.rank else None, holder_of=lambda r: r)
        except BaseException:
            new.abort("the re-shard for the joiners failed")
            new.close()
            raise
        old.close()
        self.zero = z
        self._gens = {}
        self._protect(self.step)
        self.recoveries.append({"step": self.step, "lost": [], "joined": list(range(old.world_size, new.world_size)),
                                "world": new.world_size, "grow_s": t_grow - t0, "total_s": time.monotonic() - t0})

    def _recover(self, error):
        t0 = time.monotonic()
        old_z = self.zero
        old = old_z.comm
        old_z.remove_hooks()
        new, lost = revoke_and_shrink(old, error, self.timeout)
        t_shrink = time.monotonic()
        had = self.exchanged
        g = torch.tensor([self.exchanged], dtype=torch.int64)
        new.all_reduce(g, op="min")
        gen = int(g)
        if gen not in self._gens:  # cannot happen (see the module docstring); never guess
            raise RingcommError(f"ringcomm: generation {gen} of the ZeRO state is not on rank {old.rank} "
                                f"(it keeps {sorted(self._gens)})")
        snap = self._gens[gen]
        holders = _holders(old.world_size, list(new.parent_ranks))

        def mine(r):
            holder, kind = holders[r]
            return None if holder != old.rank else (snap.own if kind == "own" else snap.held)

        self.zero = _reshard(old_z.module, old_z._params, _meta(old_z, snap, gen), new, mine,
                             holder_of=lambda r: new.parent_ranks.index(holders[r][0]))
        self._gens = {}
        self.step = gen
        self._protect(gen)
        self.recoveries.append({"step": gen, "lost": lost, "joined": [], "world": new.world_size, "had": had,
                                "shrink_s": t_shrink - t0, "total_s": time.monotonic() - t0,
                                "error": str(error)[:300]})


class _Generation:
    """One rank's shard state of one step: `own` (bytes, kept and sent on), `held`
    (the predecessor's bytes), and what the bytes need to be read back."""

    def __init__(self, own, layout, local):
        self.own, self.layout, self.local, self.held = own, layout, local, None

    @classmethod
    @torch.no_grad()
    def pack(cls, z):
        parts, layout, scalars, off = [], [], {}, 0
        for j, u in enumerate(z.units):
            items = [("master", u.master.detach())]
            state = z.optimizer.state.get(u.master, {})
            for k in sorted(state):
                v = state[k]
                if torch.is_tensor(v) and v.dim() == 1 and v.numel() == u.shard:
                    items.append((k, v))
                else:  # a scalar (Adam's step): the same on every rank
                    scalars[(j, k)] = v.clone() if torch.is_tensor(v) else copy.deepcopy(v)
            for k, t in items:
                b = t.detach().contiguous().view(torch.uint8)
                layout.append((j, k, t.dtype, off, b.numel()))
                parts.append(b)
                off += b.numel()
        group = {k: copy.deepcopy(v) for k, v in z.optimizer.param_groups[0].items() if k != "params"}
        buffers = {n: b.detach().clone() for n, b in z.module.named_buffers()}
        return cls(torch.cat(parts), layout, {"scalars": scalars, "group": group, "buffers": buffers})


def _meta(z, snap, step):
    """What reading the old world's shard states back takes (the same on every rank
    of the old world; what a joiner receives)."""
    config = {k: v for k, v in z.config.items() if k != "tp_comm"}
    return {"layout": snap.layout, "local": snap.local, "nbytes": snap.own.numel(), "world": z.world,
            "shards": [u.shard for u in z.units], "numels": [u.numel for u in z.units],
            "config": config, "step": step}


def _holders(world, survivors):
    """old rank -> (old rank holding its state, "own" | "held"), or the error."""
    alive = set(survivors)
    out = {}
    for r in range(world):
        if r in alive:
            out[r] = (r, "own")
            continue
        succ = (r + 1) % world
        if succ in alive and succ != r:
            out[r] = (succ, "held")
        else:
            raise RingcommError(
                f"ringcomm: the ZeRO shards of rank {r} and their only copy (on rank {succ}, its ring "
                f"successor) were both lost; the model state cannot be rebuilt from the survivors "
                f"{sorted(alive)}: restart from a checkpoint")
    return out


@torch.no_grad()
def _reshard(module, params, meta, new, mine, holder_of):
    """A ZeroDataParallel over `new` (built with meta's arguments) whose shards are
    the old world's state: old rank r's bytes are broadcast by new rank
    holder_of(r), which passes them as mine(r) (None elsewhere); every rank keeps
    the slices of its new shards."""
    device = params[0].device
    for p in params:  # the constructor reads (and broadcasts) real storage
        p.data = torch.zeros(p.shape, dtype=p.dtype, device=device)
        p.grad = None
    z = ZeroDataParallel(module, new, **meta["config"])
    if [u.numel for u in z.units] != meta["numels"]:
        raise RingcommError("ringcomm: the rebuilt ZeRO layer cut the model into other units")
    masters = [torch.zeros(u.shard, dtype=z.master_dtype, device=z.device) for u in z.units]
    states = [{} for _ in z.units]
    for j, k, dtype, _, _ in meta["layout"]:
        if k != "master":
            states[j][k] = torch.zeros(z.units[j].shard, dtype=dtype, device=z.device)
    for r in range(meta["world"]):
        buf = mine(r)
        if buf is None:
            buf = torch.empty(meta["nbytes"], dtype=torch.uint8, device=z.device)
        new.broadcast(buf, holder_of(r))
        for j, k, dtype, off, nb in meta["layout"]:
            u, shard = z.units[j], meta["shards"][j]
            piece = buf[off:off + nb].view(dtype)
            lo, hi = r * shard, min((r + 1) * shard, u.numel)  # elements of the flat
            a, b = max(lo, u.lo), min(hi, u.hi)
            if a < b:
                dst = masters[j] if k == "master" else states[j][k]
                dst[a - u.lo:b - u.lo].copy_(piece[a - lo:b - lo])
    for u, m in zip(z.units, masters):
        u.master.copy_(m)
    local = meta["local"]
    inner = {"param_groups": [{**local["group"], "params": list(range(len(z.units)))}], "state": {}}
    for j in range(len(z.units)):
        st = dict(states[j])
        st.update({k: (v.clone() if torch.is_tensor(v) else v) for (jj, k), v in local["scalars"].items() if jj == j})
        if st:
            inner["state"][j] = st
    z.optimizer.load_state_dict(inner)
    for n, b in module.named_buffers():
        b.copy_(local["buffers"][n])
    z._publish()
    return z


__all__ = ["ElasticZeroDataParallel"]
