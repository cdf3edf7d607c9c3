"""The primitives the sweep measures: buffer layouts and bus-bandwidth factors.

Conventions are those of nccl-tests (src/<op>.cu and doc/PERFORMANCE.md):

- ``count`` is the per-call element count a user passes (nccl-tests' "paramcount");
  for all_gather, reduce_scatter, all_to_all, scatter and gather that is the share
  of one rank, ``count = (size / itemsize) // world_size``.
- ``size`` (the table's first column) is the larger of the send and receive buffers
  of one rank, so for the per-rank-share primitives it is the total, gathered size S.
- algbw = size / time; busbw = algbw * factor, where the factor turns the algorithm
  bandwidth into the load on the busiest link, so that figures of different
  primitives and world sizes compare against the hardware's peak:

  all_reduce                            2(n-1)/n   (reduce-scatter + all-gather, each (n-1)/n of S)
  reduce_scatter, all_gather, all_to_all (n-1)/n   (every rank sends/receives all but its own 1/n)
  broadcast, reduce, sendrecv            1         (the root's / each rank's link carries S)
  scatter, gather                        (n-1)/n   (see below)

  PERFORMANCE.md names no factor for scatter and gather, but nccl-tests'
  src/scatter.cu and src/gather.cu do define one: (n-1)/n of the total S, because
  the root sends (receives) every rank's 1/n share except its own over its link.
  We follow the source, so our figures match what nccl-tests' scatter_perf and
  gather_perf print.

nccl-tests additionally rounds the per-rank count of reduce_scatter and scatter down
to a multiple of 16 bytes (a GPU vectorisation detail); we do not, so small sizes
are not turned into empty operations. A size too small to give every rank one
element is skipped for the per-rank-share primitives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional


def _all_reduce_factor(n: int) -> float:
    return 2.0 * (n - 1) / n


def _share_factor(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


@dataclass(frozen=True)
class Layout:
    """Element counts of one call on one rank (in_count == 0: in place on ``out``)."""

    count: int        # the count column: what a user passes as "count"
    in_count: int     # input buffer elements (0 when the op is in place)
    out_count: int    # output buffer elements
    size: int         # the size column in bytes: max(send, recv) bytes of one rank


@dataclass(frozen=True)
class Collective:
    name: str
    reduces: bool                   # takes a reduction op (redop column)
    rooted: bool                    # takes a root (root column)
    per_rank_share: bool            # count is one rank's 1/n share of the size
    in_place: bool                  # one buffer (all_reduce, broadcast, reduce)
    out_blocks: int                 # output = out_blocks * count ("n" = world size -> -1)
    in_blocks: int                  # input = in_blocks * count (-1 = world size)
    factor: Callable[[int], float]

    def layout(self, size_bytes: int, itemsize: int, world_size: int) -> Optional[Layout]:
        """Counts for a requested size, or None if the size cannot give every rank an element."""
        elements = size_bytes // itemsize
        count = elements // world_size if self.per_rank_share else elements
        if count < 1:
            return None
        n_out = world_size if self.out_blocks < 0 else self.out_blocks
        n_in = world_size if self.in_blocks < 0 else self.in_blocks
        out_count = n_out * count
        in_count = 0 if self.in_place else n_in * count
        return Layout(count=count, in_count=in_count, out_count=out_count,
                      size=max(in_count, out_count) * itemsize)

    def busbw(self, algbw: float, world_size: int) -> float:
        return algbw * self.factor(world_size)


COLLECTIVES: Dict[str, Collective] = {c.name: c for c in [
    Collective("all_reduce", True, False, False, True, 1, 1, _all_reduce_factor),
    Collective("reduce_scatter", True, False, True, False, 1, -1, _share_factor),
    Collective("all_gather", False, False, True, False, -1, 1, _share_factor),
    Collective("broadcast", False, True, False, True, 1, 1, _one),
    Collective("reduce", True, True, False, True, 1, 1, _one),
    Collective("scatter", False, True, True, False, 1, -1, _share_factor),
    Collective("gather", False, True, True, False, -1, 1, _share_factor),
    Collective("all_to_all", False, False, True, False, -1, -1, _share_factor),
    Collective("sendrecv", False, False, False, False, 1, 1, _one),
]}

ALIASES = {"allreduce": "all_reduce", "reducescatter": "reduce_scatter",
           "allgather": "all_gather", "alltoall": "all_to_all", "bcast": "broadcast",
           "send_recv": "sendrecv"}


def resolve_ops(spec: str) -> list:
    """"all" or a comma list of names (nccl-tests spellings such as alltoall accepted)."""
    if spec.strip().lower() == "all":
        return list(COLLECTIVES)
    ops = []
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        name = ALIASES.get(name.replace("-", "_"), name.replace("-", "_"))
        if name not in COLLECTIVES:
            raise ValueError(f"unknown op {raw!r}; expected 'all' or some of "
                             f"{', '.join(COLLECTIVES)}")
        if name not in ops:
            ops.append(name)
    if not ops:
        raise ValueError("no op given")
    return ops


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``op`` at ``world_size`` ranks."""
    return COLLECTIVES[op].factor(world_size)
