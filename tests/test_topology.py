"""Topology (issue 12, item 1): rings and chains are ordered host-contiguous whatever
the rank placement, so only one link per host boundary crosses the network. "Hosts"
here are RINGCOMM_HOST_ID values: ranks with different ids talk TCP over loopback,
ranks with the same id shared memory."""

import pytest

import checks
import harness
from ringcomm.communicator import Communicator


@pytest.mark.parametrize("hosts,order", [
    ("AAAA", [0, 1, 2, 3]),
    ("ABAB", [0, 2, 1, 3]),
    ("ABA", [0, 2, 1]),
    ("ABCAB", [0, 3, 1, 4, 2]),
    ("BBAA", [0, 1, 2, 3]),
    ("ABBA", [0, 3, 1, 2]),
])
def test_host_contiguous_order(hosts, order):
    infos = [{"host": h} for h in hosts]
    assert Communicator.host_contiguous_order(infos) == order


def _placed(comm, hosts, algo_env):
    """Every primitive's matrix with the interleaved placement, plus what the ring
    crosses: the number of ring links over TCP must be the number of hosts (one per
    boundary; one host: none)."""
    fails = []
    order = comm.ring_order
    want = Communicator.host_contiguous_order([{"host": h} for h in hosts])
    if order != want:
        fails.append(f"ring order {order}, want {want}")
    n = comm.world_size
    pos = order.index(comm.rank)
    kinds = comm.transports
    nxt = order[(pos + 1) % n]
    fails += [f"ring link {comm.rank}->{nxt} is {kinds[nxt]}, want "
              f"{'shm' if hosts[nxt] == hosts[comm.rank] else 'tcp'}"
              for _ in [0] if n > 1 and kinds[nxt] != ("shm" if hosts[nxt] == hosts[comm.rank] else "tcp")]
    fails += checks.collective_matrix(comm, counts=(0, 1, 7, 1000, 20011), big_dtypes=("float32", "int64"),
                                      tag=f"{hosts} {algo_env} ")
    return fails


@pytest.mark.parametrize("hosts,algo", [("ABAB", "auto"), ("ABAB", "ring"), ("ABA", "auto"), ("ABBA", "ring")])
def test_collectives_with_interleaved_placement(hosts, algo):
    rank_env = {r: {"RINGCOMM_HOST_ID": f"host-{h}"} for r, h in enumerate(hosts)}
    env = {"RINGCOMM_ALGO": algo} if algo != "auto" else {}
    res = harness.run_ranks(_placed, len(hosts), (hosts, algo), env=env, rank_env=rank_env,
                            comm_timeout=30.0, hard_timeout=240)
    harness.assert_no_failures(res)
