"""Correctness check of every measured size: known inputs, numpy expectations, #wrong.

Every rank fills its inputs with small integers that depend on the rank and the
element index, so that every reduction (sum, prod, min, max) is exact in every data
type, even float16 and bfloat16; only avg (a division) is compared with a tolerance.

The value of element ``i`` on rank ``r`` is ``1 + ((13*i + 31*r) % 251) % m``:

- ``m`` is 2 for prod (values 1 and 2, products stay below 2**world_size), 4 for the
  other reductions (sums stay below 4*world_size) and 100 for data movement (large
  enough that a misplaced block shows);
- 251 is prime, so the pattern never lines up with the power-of-two block offsets
  of the collectives and a block delivered to the wrong place is counted as wrong;
- the pattern has period 251, so expectations are computed on one period and tiled:
  checking 256 MiB costs a few memcpys, not a Python loop or a float64 copy;
- no value is 0, and output buffers are zeroed before the checked call, so an
  operation that does nothing is caught.

``count_wrong(got, expected)`` is the #wrong column: elements that differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from ringcomm.bench.collectives import Collective, Layout

PERIOD = 251
REDOPS = ("sum", "prod", "min", "max", "avg")


def _modulus(coll: Collective, redop: str) -> int:
    if not coll.reduces:
        return 100
    return 2 if redop == "prod" else 4


def _period(rank: int, start: int, count: int, modulus: int) -> np.ndarray:
    """Values of elements start .. start+min(count, PERIOD) on ``rank`` (float64)."""
    i = (start + np.arange(min(count, PERIOD), dtype=np.int64)) % PERIOD
    return (1 + ((13 * i + 31 * rank) % PERIOD) % modulus).astype(np.float64)


def _tile(period: np.ndarray, count: int, dtype) -> np.ndarray:
    # Cast one period, then repeat it: the full-size array is made in the target type.
    return np.resize(period.astype(dtype), count)


def rank_values(rank: int, start: int, count: int, modulus: int, dtype=np.float64) -> np.ndarray:
    """Input values of elements start .. start+count on ``rank``."""
    return _tile(_period(rank, start, count, modulus), count, dtype)


def _reduce(periods: List[np.ndarray], redop: str) -> np.ndarray:
    stack = np.stack(periods)
    if redop == "sum":
        return stack.sum(axis=0)
    if redop == "prod":
        return stack.prod(axis=0)
    if redop == "min":
        return stack.min(axis=0)
    if redop == "max":
        return stack.max(axis=0)
    if redop == "avg":
        return stack.sum(axis=0) / len(periods)
    raise ValueError(f"unknown reduction {redop!r}; expected one of {', '.join(REDOPS)}")


def tolerance(redop: str, dtype_name: str) -> float:
    """Relative tolerance: 0 (exact) except for avg, which divides."""
    if redop != "avg":
        return 0.0
    return {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-6}.get(dtype_name, 1e-12)


@dataclass
class Plan:
    """What one rank puts in its buffers before the checked call, and what it expects after.

    ``input`` is None for in-place primitives (the output buffer holds the input);
    ``output`` is the output buffer's initial content; ``expected`` is None where the
    rank has nothing to check (the non-root ranks of reduce and gather).
    """

    input: Optional[np.ndarray]
    output: np.ndarray
    expected: Optional[np.ndarray]


def plan(coll: Collective, layout: Layout, rank: int, world_size: int, redop: str,
         root: int, dtype) -> Plan:
    """Inputs and expected outputs of ``coll`` on ``rank`` (arrays of numpy ``dtype``)."""
    n, c, m = world_size, layout.count, _modulus(coll, redop)
    name = coll.name

    def values(r, start, count):
        return rank_values(r, start, count, m, dtype)

    def reduced(start, count):
        return _tile(_reduce([_period(r, start, count, m) for r in range(n)], redop), count, dtype)

    def blocks(fn):
        return np.concatenate([fn(s) for s in range(n)])

    zeros = np.zeros(layout.out_count, dtype=dtype)
    if name == "all_reduce":
        return Plan(None, values(rank, 0, c), reduced(0, c))
    if name == "reduce":
        return Plan(None, values(rank, 0, c), reduced(0, c) if rank == root else None)
    if name == "broadcast":
        init = values(root, 0, c) if rank == root else zeros
        return Plan(None, init, values(root, 0, c))
    if name == "reduce_scatter":
        return Plan(values(rank, 0, n * c), zeros, reduced(rank * c, c))
    if name == "all_gather":
        return Plan(values(rank, 0, c), zeros, blocks(lambda s: values(s, 0, c)))
    if name == "gather":
        expected = blocks(lambda s: values(s, 0, c)) if rank == root else None
        return Plan(values(rank, 0, c), zeros, expected)
    if name == "scatter":
        inp = values(root, 0, n * c) if rank == root else np.zeros(n * c, dtype=dtype)
        return Plan(inp, zeros, values(root, rank * c, c))
    if name == "all_to_all":
        # Block j of rank r's input goes to rank j: out block s on rank r = block r of s.
        return Plan(values(rank, 0, n * c), zeros, blocks(lambda s: values(s, rank * c, c)))
    if name == "sendrecv":
        # A ring: every rank sends to rank+1 and receives from rank-1.
        return Plan(values(rank, 0, c), zeros, values((rank - 1) % n, 0, c))
    raise ValueError(f"no check defined for {name!r}")


def count_wrong(got: np.ndarray, expected: np.ndarray, rtol: float = 0.0) -> int:
    """Number of elements of ``got`` that differ from ``expected`` (NaN counts as wrong)."""
    got = np.asarray(got).reshape(-1)
    expected = np.asarray(expected).reshape(-1)
    if got.shape != expected.shape:
        raise ValueError(f"result has {got.size} elements, expected {expected.size}")
    if rtol == 0.0:
        return int(np.count_nonzero(got != expected))
    ok = np.abs(got - expected) <= rtol * np.abs(expected)
    return int(ok.size - np.count_nonzero(ok))
