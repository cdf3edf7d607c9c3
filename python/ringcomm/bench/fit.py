"""`ringcomm-bench --calibrate`'s second half: each schedule family timed at a few
sizes on the machine at hand, and its cost formula corrected to match.

The alpha-beta-gamma formulas (csrc/comm/cost_model.cpp) know a schedule's
shape, not what the machine does with it: on hosts with fewer cores than
ranks, a ring whose steps overlap one another, or a socket buffer that one
message fills, two families with the same formula differ by a third, and
one family's time is not affine in the size. For every (op, family) the
model lists as a candidate here, the family runs forced (its own
communicator) at FIT_SIZES (48 B x 4^k: not the sizes a sweep reports),
all candidates of a size taking their samples in turns
(timing.measure_side_by_side), in FIT_PASSES passes of which each point
keeps the median; the ratio of each measured time to the
formula's goes into the parameter file ("fit"), and the model multiplies
the formula by it, interpolated in log(size) between the measured sizes
(FamilyFit, cost_model.h). `auto` then picks with the corrected formulas on
this topology; a model without a fit (another topology, measured at init)
uses the formulas as they are.
"""

from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Tuple

FIT_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
# x4 from 48 B to 48 MiB: off the powers of two a sweep reports (-f 2, 4, 8,
# 16), so a sweep's predictions are never the calibration's measurements read
# back; close enough that the log-size interpolation between two of them
# misses little (x16 missed a family's knee between 12 and 192 KiB by 40%).
# Past the largest size the last ratio holds: ending at 12 MiB, one noisy
# sample there put Rabenseifner 40% off at 64 MiB (4 x 2 hosts, 1 Gbit/s).
FIT_SIZES = tuple(48 << (2 * k) for k in range(11))
RATIO_RANGE = (0.02, 50.0)  # as cost_model._FIT_RATIO: a ratio beyond it is clamped


# Passes over every (op, size), each point the median of its passes: on a
# shared VM one family at one size can run 3-4x slow for a few seconds (a
# single pass put recursive doubling at 9.7x its formula at 48 KiB between
# neighbours at 2.9x and 4.1x, and auto then mispicked at 32 and 256 KiB).
# Odd passes walk the sizes downwards, so that drift over the calibration
# does not track the size.
FIT_PASSES = 3


def measure_families(control, make_backend: Callable[[str], object], model, dtype, timing,
                     on_error: Callable[[str], None], sizes=FIT_SIZES, ops=FIT_OPS,
                     passes=FIT_PASSES):
    """Times every candidate family at every (op, size), `passes` times;
    returns {(op, family): [(bytes, formula seconds, median measured
    seconds), ...]} and the failures. Every rank calls it alike (the
    backends' calls and the control's gathers meet)."""
    from ringcomm.bench.buffers import Buffer, Buffers
    from ringcomm.bench.collectives import COLLECTIVES
    from ringcomm.bench.timing import measure_side_by_side, prepare

    families = sorted({name for op in ops for s in sizes for name, _ in model.predict(op, s)})
    backends = {f: make_backend(f) for f in families}
    samples: Dict[Tuple[str, str, int], list] = {}  # (op, family, bytes) -> [formula, times...]
    failures = []
    try:
        n = control.world_size
        for k in range(passes):
            for op in ops:
                coll = COLLECTIVES[op]
                for size in (sizes if k % 2 == 0 else sizes[::-1]):
                    layout = coll.layout(size, dtype.itemsize, n)
                    if layout is None:
                        continue
                    formula = dict(model.predict(op, layout.size))  # family -> uncorrected seconds
                    names = list(formula)
                    bufs = Buffers(Buffer(layout.in_count, dtype), Buffer(layout.out_count, dtype))
                    prepared = [prepare(control, backends[f], lambda f=f: backends[f].bind(coll, bufs, "sum", 0),
                                        coll, layout, bufs, "sum", 0, dtype, timing, on_error) for f in names]
                    for f, m in zip(names, measure_side_by_side(control, prepared)):
                        if m.error or m.wrong > 0:
                            failures.append(f"{op} {layout.size} B {f}: {m.error or f'{m.wrong} wrong elements'}")
                            continue
                        samples.setdefault((op, f, layout.size), [formula[f]]).append(m.time_s)
    finally:
        for b in backends.values():
            b.close()
    points: Dict[Tuple[str, str], list] = {}
    for (op, f, size), (formula, *times) in sorted(samples.items()):
        points.setdefault((op, f), []).append((size, formula, statistics.median(times)))
    return points, failures


def fit_table(points) -> Dict[str, List[List[float]]]:
    """{"op:family": [[bytes, measured / formula], ...]} from measure_families' points."""
    lo, hi = RATIO_RANGE
    return {f"{op}:{f}": [[float(x), min(max(t / p, lo), hi)] for x, p, t in pts]
            for (op, f), pts in sorted(points.items())}
