"""The measurement loop.

For one (primitive, size, backend):

1. the checked call: inputs filled with known values, one call, #wrong counted on
   every rank (it is also the first warm-up call);
2. warm-up: one timed call, then up to ``warmup - 2`` more back to back (fewer when
   they would not fit a quarter of the time budget), timed as a group; the slowest
   rank's time per call sets the batch size and the number of samples; a backend
   that is still trying candidates for the size (ringcomm's tuner, under `auto`)
   then runs on until it has settled (at most MAX_SETTLE_CALLS calls), so the
   samples are its steady state, as a job that repeats the call sees it;
3. samples: a barrier of the measured backend, then a batch of back-to-back calls,
   timed on every rank (host clock; GPU backends synchronise before it stops). A
   batch lasts at least ``batch_s`` (one call for large sizes): a barrier releases
   the ranks some microseconds apart (a futex wake-up on a VM costs ~100 us), and a
   batch spreads that skew over many calls, as nccl-tests does by timing all its
   iterations at once; the barrier per batch keeps one slow batch from leaking into
   the next;
4. the per-sample times of all ranks are gathered; a sample's time per call is its
   slowest rank's (a call is done when it is done everywhere) divided by the batch,
   and the reported time is the median over samples. The number of samples is -n,
   cut for large sizes to what fits ``budget_s`` (never below ``min_iters``), so a
   256 MiB sweep stays short while small sizes get every sample.

Several backends at one size (``measure_side_by_side``) take steps 1-2 one after
another, then their samples in turns, sample by sample (who goes first rotating
each round), all with the same batch (the largest any asks, within each one's
budget): the machine's drift over the seconds a size takes, and the bimodal
phases of these VMs, then hit every backend alike, so two backends running the
same schedule (``auto`` and the algorithm it picks) measure alike and ratios
between backends hold within one size.

Agreement between ranks (iteration counts, #wrong, errors) goes over a separate
control process group, never through the backend being measured.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import numpy as np

from ringcomm.bench import check
from ringcomm.bench.buffers import Buffers, aligned_bytes
from ringcomm.bench.collectives import Collective, Layout


@dataclass
class TimingParams:
    iters: int = 20            # samples at most (nccl-tests -n)
    warmup: int = 5            # warm-up calls at most, the checked one included (-w)
    min_iters: int = 5         # samples at least, whatever the budget
    budget_s: float = 0.4      # target seconds of samples per size and backend
    batch_s: float = 0.005     # a sample lasts at least this long (back-to-back calls)
    check: bool = True         # -c


@dataclass
class Measurement:
    samples_s: List[float] = field(default_factory=list)  # per call, slowest rank, per sample
    batch: int = 1             # calls per sample
    warmup: int = 0
    wrong: int = -1            # -1: not checked
    error: Optional[str] = None

    @property
    def time_s(self) -> float:
        return float(np.median(self.samples_s)) if self.samples_s else float("nan")


class Control:
    """Barrier and all-gather for the harness, over torch.distributed's default group."""

    def __init__(self, rank: int, world_size: int):
        import torch
        import torch.distributed as dist

        self.dist, self.torch = dist, torch
        self.rank, self.world_size = rank, world_size

    def barrier(self) -> None:
        self.dist.barrier()

    def gather_all(self, values) -> np.ndarray:
        """Every rank's equally long float64 vector, as rows of a (world_size, k) array."""
        t = self.torch.as_tensor(np.asarray(values, dtype=np.float64).reshape(-1))
        rows = [self.torch.empty_like(t) for _ in range(self.world_size)]
        self.dist.all_gather(rows, t)
        return np.stack([r.numpy() for r in rows])

    def slowest(self, seconds: float) -> float:
        """The largest of every rank's `seconds`."""
        return float(self.gather_all([seconds]).max())

    def gather_objects(self, obj) -> list:
        out = [None] * self.world_size
        self.dist.all_gather_object(out, obj)
        return out


# Warm-up calls at most while a backend is still trying candidates (Backend.exploring).
MAX_SETTLE_CALLS = 32


def _extra_warmup(first_s: float, p: TimingParams) -> int:
    return int(min(max(p.warmup - 2, 0), (p.budget_s / 4) // max(first_s, 1e-9)))


def warm_up(run: Callable[[], None], p: TimingParams, agree: Optional[Callable[[float], float]] = None,
            barrier: Callable[[], None] = lambda: None):
    """A reference's warm-up: one call, one timed call, then the extra warm-up
    calls (_extra_warmup). `agree` turns this rank's time into the one every
    rank uses (the slowest rank's, for references that run on every rank at
    once), so that all ranks make as many calls: a socket's two ends pair
    theirs up. Returns (per-call seconds, extra calls made)."""
    agree = agree or (lambda s: s)
    run()
    barrier()
    t0 = time.perf_counter()
    run()
    first = agree(time.perf_counter() - t0)
    extra = _extra_warmup(first, p)
    per_call = first
    if extra:
        barrier()
        t0 = time.perf_counter()
        for _ in range(extra):
            run()
        per_call = agree((time.perf_counter() - t0) / extra)
    return per_call, extra


def _schedule(per_call_s: float, p: TimingParams):
    """(calls per sample, samples) for a call that takes ``per_call_s``."""
    per_call_s = max(per_call_s, 1e-9)
    batch = min(max(1, math.ceil(round(p.batch_s / per_call_s, 6))), 1_000_000)
    return batch, _samples(batch, per_call_s, p)


def _samples(batch: int, per_call_s: float, p: TimingParams) -> int:
    """Samples of `batch` calls that fit the budget, within [min_iters, iters]."""
    return int(min(p.iters, max(p.min_iters, p.budget_s // (batch * max(per_call_s, 1e-9)))))


def _timed_samples(barrier, run, sync, batch: int, samples: int) -> np.ndarray:
    clock = time.perf_counter
    times = np.empty(samples)
    calls = range(batch)
    for i in range(samples):
        barrier()
        t0 = clock()
        for _ in calls:
            run()
        sync()
        times[i] = (clock() - t0) / batch
    return times


def _checked_call(backend, run, coll, layout, bufs, rank, n, redop, root, dtype) -> int:
    np_dtype = np.dtype(dtype.check)
    plan = check.plan(coll, layout, rank, n, redop, root, np_dtype)
    if plan.input is not None:
        bufs.input.fill(plan.input)
    bufs.output.fill(plan.output)
    run()
    backend.synchronize()
    if plan.expected is None:
        return 0
    return check.count_wrong(bufs.output.read(), plan.expected,
                             check.tolerance(redop, dtype.name))


@dataclass
class Prepared:
    """A backend's call after steps 1-2: how to sample it, or why it failed."""
    backend: object = None
    run: Optional[Callable[[], None]] = None
    batch: int = 1
    samples: int = 0
    warmup: int = 0
    wrong: int = -1
    error: Optional[str] = None
    per_call: float = 0.0      # seconds, the warm-up's estimate (slowest rank)
    params: Optional[TimingParams] = None


def prepare(control: Control, backend, make_run: Callable[[], Callable[[], None]],
            coll: Collective, layout: Layout, bufs: Buffers, redop: str, root: int, dtype,
            p: TimingParams, on_error: Callable[[str], None]) -> Prepared:
    """Steps 1-2 above, on every rank; every rank returns the same batch and samples.

    ``make_run`` binds the call (``backend.bind``); it runs inside the error guard, so
    a backend refusing an argument is reported like a failing call.
    """
    rank = control.rank
    wrong, first, failure = 0, 0.0, ""
    control.barrier()
    try:
        run = make_run()
        if p.check:
            wrong = _checked_call(backend, run, coll, layout, bufs, rank, control.world_size, redop, root, dtype)
        else:
            run()
            backend.synchronize()
        t0 = time.perf_counter()
        run()
        backend.synchronize()
        first = time.perf_counter() - t0
    except Exception as e:  # reported; the caller skips the backend for this primitive
        failure = f"{type(e).__name__}: {e}".splitlines()[0]
        on_error(f"rank {rank}: {backend.name} {coll.name} failed:\n{traceback.format_exc()}")
    agreed = control.gather_all([first, wrong, 1.0 if failure else 0.0])
    if agreed[:, 2].any():
        messages = control.gather_objects(failure)
        return Prepared(backend=backend, error=next(m for m in messages if m))
    first = float(agreed[:, 0].max())
    extra = _extra_warmup(first, p)
    per_call = first
    if extra:
        t0 = time.perf_counter()
        for _ in range(extra):
            run()
        backend.synchronize()
        per_call = float(control.gather_all([(time.perf_counter() - t0) / extra]).max())
    # A backend that tunes itself per size (ringcomm's auto) is sampled once it
    # has settled, as a job that repeats the call sees it.
    settling = 0
    exploring = getattr(backend, "exploring", None)
    while exploring and settling < MAX_SETTLE_CALLS and exploring():
        run()
        settling += 1
    backend.synchronize()
    batch, samples = _schedule(per_call, p)
    return Prepared(backend=backend, run=run, batch=batch, samples=samples, warmup=2 + extra + settling,
                    wrong=int(agreed[:, 1].sum()) if p.check else -1, per_call=per_call, params=p)


def _finish(control: Control, prep: Prepared, times) -> Measurement:
    if prep.error:
        return Measurement(error=prep.error)
    slowest = control.gather_all(np.asarray(times, dtype=float)).max(axis=0)
    return Measurement(samples_s=slowest.tolist(), batch=prep.batch, warmup=prep.warmup, wrong=prep.wrong)


def measure(control: Control, backend, make_run: Callable[[], Callable[[], None]],
            coll: Collective, layout: Layout, bufs: Buffers, redop: str, root: int, dtype,
            p: TimingParams, on_error: Callable[[str], None]) -> Measurement:
    """Steps 1-4 above for one backend, on every rank; every rank returns the same Measurement."""
    prep = prepare(control, backend, make_run, coll, layout, bufs, redop, root, dtype, p, on_error)
    return measure_side_by_side(control, [prep])[0]


def _common_batch(prepared: List[Prepared]) -> None:
    """One batch for every backend of a size (each capped so its min_iters samples
    fit its budget), the largest any asks: a batch spreads the barrier's release
    skew (~100 us here) over its calls, so two backends timed with batches of 2
    and 6 differ by a third at 400 us a call although they run the same
    schedule (one warm-up estimate that came out slow is enough)."""
    if len(prepared) < 2:
        return
    want = max(p.batch for p in prepared)
    for p in prepared:
        if p.params is None:
            continue
        cap = max(1, int(p.params.budget_s / (p.params.min_iters * max(p.per_call, 1e-9))))
        p.batch = max(p.batch, min(want, cap))
        p.samples = _samples(p.batch, p.per_call, p.params)


def measure_side_by_side(control: Control, prepared: List[Prepared]) -> List[Measurement]:
    """Steps 3-4 for backends prepared at one size, their samples taken in turns.

    Round j takes sample j of every backend that has one left, starting from backend
    j mod len: every rank loops alike (batch and samples are agreed), so the
    backends' barriers meet.
    """
    live = [i for i, prep in enumerate(prepared) if not prep.error]
    _common_batch([prepared[i] for i in live])
    times: dict = {i: [] for i in live}
    rounds = max((prepared[i].samples for i in live), default=0)
    for j in range(rounds):
        for k in range(len(live)):
            i = live[(j + k) % len(live)]
            prep = prepared[i]
            if j < prep.samples:
                b = prep.backend
                times[i].append(float(_timed_samples(b.barrier, prep.run, b.synchronize, prep.batch, 1)[0]))
    return [_finish(control, prep, times.get(i, [])) for i, prep in enumerate(prepared)]


class MemcpyReference:
    """Single-thread np.copyto of the same sizes on rank 0: the host's memory reference.

    The other ranks wait in the control barrier (blocked, not spinning) meanwhile.
    Both buffers are page aligned and allocated once at the largest size.
    """

    name = "memcpy"

    def __init__(self, control: Control, maxbytes: int):
        self.control = control
        self.src = self.dst = None
        if control.rank == 0:
            self.src = aligned_bytes(maxbytes)
            self.dst = aligned_bytes(maxbytes)
            self.src.fill(1)
            self.dst.fill(0)

    def measure(self, nbytes: int, p: TimingParams) -> Measurement:
        self.control.barrier()
        result = Measurement()
        if self.control.rank == 0:
            src, dst = self.src[:nbytes], self.dst[:nbytes]

            def copy():
                np.copyto(dst, src)

            per_call, extra = warm_up(copy, p)
            batch, samples = _schedule(per_call, p)
            times = _timed_samples(lambda: None, copy, lambda: None, batch, samples)
            result = Measurement(samples_s=times.tolist(), batch=batch, warmup=2 + extra)
        self.control.barrier()
        return result


class MemcpyAllReference:
    """np.copyto of the same sizes on every rank at once, each between its own
    page-aligned buffers: the memory bandwidth a rank gets while every rank
    streams, as every rank of a large collective does (on a VM of a few cores
    the ranks share one memory path: two copies at once each run at about
    half the speed of one). A sample's time is the slowest rank's."""

    name = "memcpy_all"

    def __init__(self, control: Control, maxbytes: int):
        self.control = control
        self.src = aligned_bytes(maxbytes)
        self.dst = aligned_bytes(maxbytes)
        self.src.fill(1)
        self.dst.fill(0)

    def measure(self, nbytes: int, p: TimingParams) -> Measurement:
        c = self.control
        src, dst = self.src[:nbytes], self.dst[:nbytes]

        def copy():
            np.copyto(dst, src)

        per_call, extra = warm_up(copy, p, c.slowest, c.barrier)
        batch, samples = _schedule(per_call, p)
        times = _timed_samples(c.barrier, copy, lambda: None, batch, samples)
        slowest = c.gather_all(np.asarray(times, dtype=float)).max(axis=0)
        return Measurement(samples_s=slowest.tolist(), batch=batch, warmup=2 + extra)
