"""How waiting ranks wait: they spin unless the ranks that compete for their
cores outnumber those cores (communicator.cores_contended), judged from every
rank's CPU affinity in the census, so that a launcher that pins each rank to
its own core (Intel MPI's mpiexec) keeps the spinning waits."""

import os
from datetime import timedelta

import numpy as np
import pytest

import harness
from ringcomm.communicator import cores_contended


def _infos(*cpu_sets, host="h"):
    return [{"host": host, "cpus": sorted(c)} for c in cpu_sets]


def _verdicts(infos, uses_tcp=False):
    return [cores_contended(r, infos, uses_tcp) for r in range(len(infos))]


def test_cores_contended_rules():
    both = {0, 1}
    # Unpinned: ranks against the cores they all share.
    assert _verdicts(_infos(both, both)) == [False, False]
    assert _verdicts(_infos(both, both, both)) == [True] * 3
    # Pinned one rank per core (Intel MPI at 2 ranks): each alone on its core.
    assert _verdicts(_infos({0}, {1})) == [False, False]
    assert _verdicts(_infos({0}, {1}, {2}, {3})) == [False] * 4
    # Two ranks pinned per core (Intel MPI at 4 ranks on 2 cores).
    assert _verdicts(_infos({0}, {1}, {0}, {1})) == [True] * 4
    # Overlaps chain: {0} and {1} meet through {0, 1}, so all three decide alike.
    assert _verdicts(_infos({0}, both, {1})) == [True] * 3
    # Disjoint groups decide apart.
    assert _verdicts(_infos({0}, {0}, {1, 2}, {3})) == [True, True, False, False]
    # Another host's ranks never compete.
    infos = _infos(both, both) + _infos(both, both, host="other")
    assert _verdicts(infos) == [False] * 4
    # A rank with TCP peers counts its I/O thread.
    assert _verdicts(_infos(both, both), uses_tcp=True) == [True, True]
    assert _verdicts(_infos({0, 1, 2, 3}, {0, 1, 2, 3}), uses_tcp=True) == [False, False]


def _pinned(comm, layouts):
    """In a rank: for each layout (rank -> CPUs, or None: unpinned), pin this
    process, init a communicator, record how it waits and check a call."""
    import torch.distributed as dist

    import ringcomm

    ctx = harness.context()
    r, ws = ctx.rank, ctx.world_size
    everything = sorted(os.sched_getaffinity(0))
    seen, fails = [], []
    for i, layout in enumerate(layouts):
        os.sched_setaffinity(0, everything if layout is None else layout[r])
        with ringcomm.init(rank=r, world_size=ws, store=dist.PrefixStore(f"l{i}", ctx.store),
                           timeout=timedelta(seconds=30)) as c:
            seen.append(c._waiting)
            x = np.full(1000, r + 1.0, np.float32)
            c.all_reduce(x)
            if not np.all(x == ws * (ws + 1) / 2):
                fails.append(f"layout {layout}: all_reduce gave {x[:3]}")
    os.sched_setaffinity(0, everything)
    return {"seen": seen, "fails": fails}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs 2 CPUs and sched_setaffinity")
def test_pinned_ranks_spin_shared_ones_yield():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    own = {0: {cpus[0]}, 1: {cpus[1]}}
    shared = {0: {cpus[0]}, 1: {cpus[0]}}
    res = harness.run_ranks(_pinned, 2, ([own, shared, None],), init=False, hard_timeout=120,
                            env={"RINGCOMM_TRANSPORT": "shm"})
    harness.assert_no_failures([x["fails"] for x in res])
    # Unpinned on this host: 2 ranks on at least 2 cores spin.
    assert [x["seen"] for x in res] == [["spin", "yield", "spin"]] * 2
