"""Communicators that span "hosts" (RINGCOMM_HOST_ID per rank: shared memory
within a host, TCP between hosts, all on this machine): the hierarchical
all-reduce for every dtype, op and size with even, uneven and interleaved
placements, every primitive under `auto` (the cost model picks) and with
the rank-order ring, against numpy, identical bits on every rank
(checks.py)."""

import pytest

import checks
import harness


def _matrix(comm, kwargs):
    return checks.collective_matrix(comm, **kwargs)


def _hosts(labels):
    return {r: {"RINGCOMM_HOST_ID": f"h{h}"} for r, h in enumerate(labels)}


def _run(labels, env, hard_timeout=240, **kwargs):
    results = harness.run_ranks(_matrix, len(labels), (kwargs,), env=env, rank_env=_hosts(labels),
                                comm_timeout=30.0, hard_timeout=hard_timeout)
    harness.assert_no_failures(results)


@pytest.mark.parametrize("labels", [
    (0, 0, 1, 1),           # 2 hosts x 2, contiguous
    (0, 1, 0, 1, 0),        # interleaved, uneven (3 + 2)
    (0, 1, 1, 2, 2, 2),     # 1 + 2 + 3 ranks
    (0, 1, 2),              # one rank per host: the inter-host ring alone
    (0, 1, 2, 0, 1, 2),     # 3 x 2 interleaved
], ids=["2x2", "interleaved-3+2", "1+2+3", "3x1", "3x2-interleaved"])
def test_hierarchical_schedules(labels):
    """all_reduce, the trees of trees of broadcast and reduce (every root: the
    matrix rotates them), all_gather and reduce_scatter (per local index across
    hosts and per host inside; on uneven hosts the blocks past the smallest host's
    count take further rounds)."""
    _run(labels, {"RINGCOMM_ALGO": "hierarchical"},
         prims=("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"),
         counts=(0, 1, 2, 7, 1000, 65537), tag=f"hierarchical {labels} ")


def test_hierarchical_many_rounds():
    """Small slots: every phase's ring takes many pipelined rounds."""
    _run((0, 1, 0, 1), {"RINGCOMM_ALGO": "all_reduce:hierarchical", "RINGCOMM_SLOT_BYTES": 256,
                        "RINGCOMM_SLOTS": 4, "RINGCOMM_PULL": 0},
         prims=("all_reduce",), counts=(0, 5, 1000, checks.BIG), dtypes=("float32", "int32", "bfloat16"),
         tag="hierarchical small slots ")


def test_hierarchical_on_one_host_is_the_ring():
    _run((0, 0, 0), {"RINGCOMM_ALGO": "hierarchical"}, prims=("all_reduce",), counts=(0, 7, 1000),
         tag="hierarchical one host ")


@pytest.mark.parametrize("labels,env", [
    ((0, 1, 0, 1, 0), {}),
    ((0, 1, 0, 1), {"RINGCOMM_RING_ORDER": "rank"}),
], ids=["auto-interleaved", "rank-order-ring"])
def test_every_primitive_across_hosts(labels, env):
    """Whatever the model picks per size (one-shot, doubling, hierarchical,
    trees, Bruck, rings in host order or rank order)."""
    _run(labels, env, counts=(0, 1, 7, 1000, 65537), big_dtypes=("float32", "int64", "float16"),
         tag=f"across hosts {labels} {env} ", hard_timeout=300)
