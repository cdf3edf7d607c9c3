"""Splitting one communicator into tensor-, pipeline- and data-parallel groups.

Global rank r of a (tp, pp, dp) layout sits at

    tp_rank = r % tp,   dp_rank = (r // tp) % dp,   pp_rank = r // (tp * dp)

(Megatron-LM's default order: tensor-parallel ranks are neighbours, since they talk
most, then data-parallel replicas, then pipeline stages). Each rank is in one group
of each kind; its rank inside that group is its coordinate along that axis, so the
pipeline group's rank is the stage index and the tensor group's rank the shard index.
"""
from dataclasses import dataclass

from ringcomm.communicator import Communicator
from ringcomm.errors import RingcommError


@dataclass
class ParallelGroups:
    tp: Communicator
    pp: Communicator
    dp: Communicator
    tp_size: int
    pp_size: int
    dp_size: int
    tp_rank: int
    pp_rank: int
    dp_rank: int

    def close(self):
        for c in (self.tp, self.pp, self.dp):
            c.close()


def layout_ranks(world_size, tp, pp, dp):
    """The global ranks of every TP, PP and DP group, as three lists of lists."""
    if tp * pp * dp != world_size:
        raise ValueError(f"tp * pp * dp = {tp} * {pp} * {dp} = {tp * pp * dp} differs from the "
                         f"world size {world_size}")

    def rank(t, p, d):
        return t + tp * (d + dp * p)

    tp_groups = [[rank(t, p, d) for t in range(tp)] for p in range(pp) for d in range(dp)]
    pp_groups = [[rank(t, p, d) for p in range(pp)] for d in range(dp) for t in range(tp)]
    dp_groups = [[rank(t, p, d) for d in range(dp)] for p in range(pp) for t in range(tp)]
    return tp_groups, pp_groups, dp_groups


def split_3d(comm, tp=1, pp=1, dp=None):
    """Splits comm into this rank's TP, PP and DP communicators (every rank calls it
    with the same layout). dp defaults to world_size / (tp * pp)."""
    ws = comm.world_size
    if dp is None:
        if ws % (tp * pp):
            raise ValueError(f"world size {ws} does not divide by tp * pp = {tp * pp}")
        dp = ws // (tp * pp)
    groups = layout_ranks(ws, tp, pp, dp)
    mine = []
    for kind in groups:  # every rank calls split for every group, in the same order
        found = None
        for ranks in kind:
            sub = comm.split(ranks=ranks)
            if sub is not None:
                found = sub
        mine.append(found)
    r = comm.rank
    return ParallelGroups(tp=mine[0], pp=mine[1], dp=mine[2], tp_size=tp, pp_size=pp, dp_size=dp,
                          tp_rank=r % tp, pp_rank=r // (tp * dp), dp_rank=(r // tp) % dp)


def drop_lost_replicas(world, groups, timeout=None):
    """3D recovery after a fault: a lost TP or PP rank takes its whole model
    replica (its TP x PP group) with it, and the other replicas go on.

    Every live rank of `world` (the communicator split_3d split) calls it once
    some call of its failed. It revokes this rank's groups and `world` (every
    rank's calls on them stop), agrees over `world` on who is gone, and maps
    each gone rank to its replica (its DP coordinate). A rank of a lost
    replica gets (None, None): it is out (close it, or let it wait to rejoin).
    The others get (the shrunk world, split_3d of it with one replica less per
    lost one): each keeps its TP and PP coordinates, so its stage and shard
    of the model stay as they are; only the DP groups are smaller.
    """
    tp, pp, dp = groups.tp_size, groups.pp_size, groups.dp_size
    for c in (groups.tp, groups.pp, groups.dp, world):
        try:
            c.revoke("a rank was lost: dropping its replica")
        except RingcommError:
            pass  # closed already
    _, gone = world.agree(True, timeout=timeout)
    lost = sorted({(r // tp) % dp for r in gone})
    if len(lost) == dp:
        raise RingcommError(f"ringcomm: every data-parallel replica lost a rank (ranks {gone} are gone): "
                            "nothing is left to continue")
    dropped = [r for r in range(world.world_size) if (r // tp) % dp in lost]
    for c in (groups.tp, groups.pp, groups.dp):
        c.close()
    if world.rank in dropped:
        return None, None
    new_world = world.shrink(exclude=dropped, timeout=timeout)
    return new_world, split_3d(new_world, tp=tp, pp=pp)
