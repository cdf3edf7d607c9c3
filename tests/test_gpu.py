"""The GPU path on one GPU (NCCL refuses two ranks of one communicator on one GPU, so the
communicators here have world size 1; multi-rank GPU runs go through the CUDA-IPC
transport). Everything here needs a CUDA GPU, torch with CUDA and NCCL, and skips with
the reason otherwise. scripts/gpu_check.sh runs this file, tests/test_gpu_checks.py (what
world size 1 otherwise never reaches) and a short GPU sweep.

- kernels: every dtype x op of ringcomm's CUDA kernels against the CPU kernels, bit for
  bit (NaN payloads aside), aligned and misaligned, in place;
- every primitive x dtype x op, both algorithm families (nccl, ring), against numpy;
- stream ordering, overlap with compute, tensor lifetime, CUDA-graph capture, cupy;
- faults (issue 13): closing with a tensor's last reference in flight, the watchdog
  beside a global-mode capture, a watchdog abort that must raise, DeviceGuard's
  primary-context check.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import ringcomm
from ringcomm import _C

from gpu_marks import gpu_marks

torch = pytest.importorskip("torch")

pytestmark = gpu_marks(torch)

DTYPES = {0: torch.float16, 1: torch.bfloat16, 2: torch.float32, 3: torch.float64, 4: torch.int8,
          5: torch.uint8, 6: torch.int32, 7: torch.int64, 8: torch.bool}
OPS = list(ringcomm.ReduceOp)


def _random(code, n, seed):
    g = torch.Generator().manual_seed(seed)
    t = DTYPES[code]
    if t.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float32) * 3
        if n > 8:
            x[3] = float("nan")
            x[5] = float("inf")
            x[7] = -0.0
        return x.to(t)
    if t == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    info = torch.iinfo(t)
    return torch.randint(max(info.min, -(2 ** 31)), min(info.max, 2 ** 31 - 1), (n,), generator=g, dtype=torch.int64).to(t)


def _same_bits(a, b):
    """Equal values and signs (so -0.0 != 0.0), counting any NaN equal to any NaN."""
    a, b = a.cpu(), b.cpu()
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    a, b = a.double(), b.double()
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    return torch.equal(a[~nan], b[~nan]) and torch.equal(torch.signbit(a[~nan]), torch.signbit(b[~nan]))


@pytest.fixture(scope="module")
def comm():
    from torch.distributed import HashStore

    c = ringcomm.init(rank=0, world_size=1, store=HashStore())
    yield c
    c.close()


# ------------------------------------------------------------------ kernels

@pytest.mark.parametrize("code", sorted(DTYPES))
def test_cuda_kernels_match_cpu_kernels(code):
    dev = torch.device("cuda", 0)
    stream = torch.cuda.current_stream(dev).cuda_stream
    for op in OPS:
        if not _C.reduce_op_supported(code, int(op)):
            continue
        for n in (0, 1, 7, 1000, 100003):
            for off in (0, 1):  # element offset 1: not 16-byte aligned
                a = _random(code, n + off, 1)[off:]
                b = _random(code, n + off, 2)[off:]
                want = torch.empty_like(a)
                _C.local_reduce(want, a, b, int(op), 3)
                # Sliced on the GPU, so off=1 really is misaligned there.
                ga = _random(code, n + off, 1).to(dev)[off:]
                gb = _random(code, n + off, 2).to(dev)[off:]
                got = torch.empty(n + off, dtype=ga.dtype, device=dev)[off:]
                _C.cuda_local_reduce(got.data_ptr(), ga.data_ptr(), gb.data_ptr(), n, code, int(op), 3, stream)
                torch.cuda.synchronize(dev)
                assert _same_bits(got, want), f"{DTYPES[code]} {op.name} n={n} off={off}"
                # In place (dst == a).
                _C.cuda_local_reduce(ga.data_ptr(), ga.data_ptr(), gb.data_ptr(), n, code, int(op), 3, stream)
                torch.cuda.synchronize(dev)
                assert _same_bits(ga, want), f"in place {DTYPES[code]} {op.name} n={n} off={off}"


# -------------------------------------------------------- every primitive

@pytest.mark.parametrize("algo", ["nccl", "ring", "auto"])
def test_every_primitive_every_dtype(comm, algo):
    dev = torch.device("cuda", 0)
    failures = []
    for code, t in DTYPES.items():
        for n in (0, 1, 1000, (1 << 20) + 3):
            x = _random(code, n, 3)
            for op in OPS:
                if not _C.reduce_op_supported(code, int(op)):
                    continue
                # NCCL has no bool and no bitwise ops; its floating-point MIN/MAX drop NaN
                # (ringcomm propagates it), so forcing NCCL on those is refused.
                fam_ok = algo != "nccl" or (t != torch.bool and op.name not in ("BAND", "BOR", "BXOR")
                                            and not (t.is_floating_point and op.name in ("MIN", "MAX")))
                g = x.to(dev)
                if not fam_ok:
                    with pytest.raises(ValueError):
                        comm.all_reduce(g, op, algo=algo)
                    continue
                comm.all_reduce(g, op, algo=algo)
                want = x  # world size 1: every op (AVG: x / 1) gives the input back, bit for bit
                if not _same_bits(g, want):
                    failures.append(f"all_reduce {t} {op.name} n={n}")
                out = torch.empty_like(g)
                comm.reduce_scatter(out, x.to(dev), op, algo=algo)
                if not _same_bits(out, want):
                    failures.append(f"reduce_scatter {t} {op.name} n={n}")
                g = x.to(dev)
                comm.reduce(g, 0, op, algo=algo)
                if not _same_bits(g, want):
                    failures.append(f"reduce {t} {op.name} n={n}")
            g = x.to(dev)
            comm.broadcast(g, 0, algo=algo)
            out = torch.empty_like(g)
            comm.all_gather(out, x.to(dev), algo=algo)
            for name, got in (("broadcast", g), ("all_gather", out)):
                if not _same_bits(got, x):
                    failures.append(f"{name} {t} n={n}")
            if algo != "auto":
                continue
            for name in ("scatter", "gather", "all_to_all"):
                out = torch.empty_like(x, device=dev)
                getattr(comm, name)(out, x.to(dev))
                if not _same_bits(out, x):
                    failures.append(f"{name} {t} n={n}")
    torch.cuda.synchronize()
    assert not failures, failures[:20]


def test_async_work_and_errors(comm):
    dev = torch.device("cuda", 0)
    x = torch.arange(1 << 20, device=dev, dtype=torch.float32)
    w = comm.all_reduce(x, async_op=True)
    assert isinstance(w, ringcomm.cuda.GpuWork)
    w.wait()  # the current stream waits; the host does not
    w.synchronize()
    assert w.is_completed()
    assert torch.equal(x.cpu(), torch.arange(1 << 20, dtype=torch.float32))
    with pytest.raises(ValueError, match="stream= and algo= apply to GPU buffers"):
        comm.all_reduce(np.zeros(4, np.float32), stream=0)
    with pytest.raises(ValueError):
        comm.all_reduce(x, algo="bogus")
    with pytest.raises(ValueError, match="NCCL has no"):
        comm.all_reduce(torch.zeros(4, dtype=torch.int32, device=dev), ringcomm.ReduceOp.BXOR, algo="nccl")
    with pytest.raises(ValueError, match="one device|cpu"):
        comm.all_gather(torch.zeros(4, device=dev), torch.zeros(4))


# ----------------------------------------------------------- stream semantics

def test_stream_ordering(comm):
    """A kernel on the caller's stream writes the input right before the op: the result
    reflects it (the op waits for the caller's stream). The op is an out-of-place
    all_gather (at world size 1 a copy), so a missing wait would copy zeros."""
    dev = torch.device("cuda", 0)
    side = torch.cuda.Stream(dev)
    for it, algo in enumerate(["nccl", "ring"] * 3):
        x = torch.zeros(1 << 22, device=dev)
        out = torch.zeros(1 << 22, device=dev)
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # tens of ms of GPU time before the write
            x.fill_(it + 1)
            comm.all_gather(out, x, stream=side, algo=algo)
            y = out * 2  # on `side`: ordered after the op (a sync call makes `side` wait)
        torch.cuda.synchronize(dev)
        assert torch.all(y == 2 * (it + 1)), f"round {it} ({algo}): the op did not wait for the caller stream"
        # No stream given: the current stream.
        z = torch.zeros(1 << 20, device=dev)
        out2 = torch.zeros(1 << 20, device=dev)
        torch.cuda._sleep(20_000_000)
        z.fill_(3)
        comm.all_gather(out2, z, algo=algo)
        assert torch.all(out2 == 3)


def test_overlap_with_compute(comm):
    """Communication on the comm stream runs while matmuls run on a compute stream: the
    two together take well under the sum of each alone. (World size 1: the ring
    all_gather is a 1 GiB device copy queued on the comm stream.)"""
    dev = torch.device("cuda", 0)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1 << 28, device=dev)  # 1 GiB
    out = torch.empty_like(x)
    compute = torch.cuda.Stream(dev)

    def timed(fn):
        torch.cuda.synchronize(dev)
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t

    def mm():
        with torch.cuda.stream(compute):
            for _ in range(20):
                a @ a

    def comm_only():
        for _ in range(20):
            comm.all_gather(out, x, async_op=True, algo="ring")

    mm(), comm_only()  # warm up
    t_mm, t_c = timed(mm), timed(comm_only)
    t_both = timed(lambda: (mm(), comm_only()))
    assert t_both < 0.9 * (t_mm + t_c), f"no overlap: matmul {t_mm:.4f} s, comm {t_c:.4f} s, both {t_both:.4f} s"


def test_tensor_lifetime(comm):
    """Free the tensors right after an async op: their memory is not handed to new
    tensors until the op finished (no corruption: the communicator holds references
    until the op's event completed; no record_stream). The op (a ring all_gather: at
    world size 1 a copy into `out`) is held back on the comm stream by a long kernel
    queued before it on the caller's stream."""
    dev = torch.device("cuda", 0)
    for _ in range(5):
        x = torch.ones(1 << 24, device=dev)
        out = torch.zeros(1 << 24, device=dev)
        torch.cuda._sleep(50_000_000)
        w = comm.all_gather(out, x, async_op=True, algo="ring")
        del x, out
        ys = [torch.full((1 << 24,), 7.0, device=dev) for _ in range(4)]
        w.synchronize()
        torch.cuda.synchronize(dev)
        assert all(bool(torch.all(y == 7)) for y in ys)


def test_cuda_graph_capture(comm):
    dev = torch.device("cuda", 0)
    x = torch.zeros(1 << 16, device=dev)
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        comm.all_reduce(x)  # warm up (creates the NCCL communicator outside the capture)
    torch.cuda.synchronize(dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
        comm.all_reduce(x)
        x.mul_(2)
    for i in range(3):
        x.fill_(i)
        g.replay()
        torch.cuda.synchronize(dev)
        assert torch.all(x == (i + 1) * 2), f"replay {i}"


def test_cupy_arrays(comm):
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(1000, dtype=cupy.float32)
    comm.all_reduce(x, stream=cupy.cuda.get_current_stream())
    out = cupy.empty(1000, cupy.float32)
    comm.all_gather(out, x)
    cupy.cuda.get_current_stream().synchronize()
    assert bool((out == cupy.arange(1000, dtype=cupy.float32)).all())


def test_build_and_nccl_info():
    info = ringcomm.build_info()
    assert info["cuda"] is True
    version, path = ringcomm.cuda.nccl_version()
    assert version >= 21000 and "nccl" in path


# ------------------------------------------------ faults (issue 13, defects 1-6)

def _run_fresh(code, timeout=120):
    """Runs `code` in a fresh interpreter (its own CUDA context); returns its stdout."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_close_with_the_last_reference_in_flight():
    """Defect 1: close() a communicator while its call holds the last reference to a
    tensor, then free and allocate again. With record_stream on the comm stream,
    torch's allocator would record an event on the stream close() destroyed."""
    out = _run_fresh("""
        import torch, ringcomm
        from torch.distributed import HashStore
        dev = torch.device("cuda", 0)
        c = ringcomm.init(rank=0, world_size=1, store=HashStore())
        n = 1 << 24
        for algo in ("ring", "nccl"):
            x, out = torch.ones(n, device=dev), torch.zeros(n, device=dev)
            c.all_gather(out, x, algo=algo)  # creates the NCCL communicator
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # holds the next calls back on the comm stream
        w = c.all_gather(out, x, async_op=True, algo="ring")
        c.all_reduce(out, algo="nccl")
        del x, out, w  # the last references are the communicator's
        c.close()  # drains the comm stream, destroys it, then drops them
        ys = [torch.full((n,), 7.0, device=dev) for _ in range(8)]  # reuses the freed blocks
        torch.cuda.synchronize()
        assert all(bool((y == 7).all()) for y in ys)
        del ys
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_watchdog_leaves_a_global_capture_alone():
    """Defect 2: an eager call is pending (held back by a long kernel) while this
    thread captures a CUDA graph in global mode; the watchdog polls its event all
    along, and another thread asks is_completed() (what _prune does). The capture
    must end cleanly and the communicator must not be aborted."""
    from torch.distributed import HashStore

    dev = torch.device("cuda", 0)
    c = ringcomm.init(rank=0, world_size=1, store=HashStore())
    try:
        x, out = torch.ones(1 << 20, device=dev), torch.zeros(1 << 20, device=dev)
        c.all_gather(out, x, algo="ring")
        torch.cuda.synchronize(dev)
        side, cap = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000_000)  # about a second of GPU time
        w = c.all_gather(out, x, async_op=True, stream=side, algo="ring")
        y = torch.zeros(1 << 16, device=dev)
        polled = []
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(cap):
            g.capture_begin(capture_error_mode="global")
            y.add_(1)
            t = threading.Thread(target=lambda: polled.append(w.is_completed()))
            t.start()
            time.sleep(0.4)  # eight watchdog polls
            t.join()
            y.mul_(3)
            g.capture_end()
        assert polled == [False]
        w.synchronize()
        assert w.exception() is None
        g.replay()
        torch.cuda.synchronize(dev)
        assert torch.all(y == 3)
        c.all_reduce(out, algo="nccl")  # not aborted
        torch.cuda.synchronize(dev)
    finally:
        c.close()


def test_watchdog_abort_raises_and_close_returns():
    """Defects 3 and 4: a call held past the communicator's 2 s timeout is aborted by
    the watchdog. Its event completes afterwards (every event does), yet wait() and
    synchronize() raise, exception() returns the timeout, later calls raise, and
    close() returns."""
    from torch.distributed import HashStore

    dev = torch.device("cuda", 0)
    c = ringcomm.init(rank=0, world_size=1, store=HashStore(), timeout=2)
    x, out = torch.ones(1 << 20, device=dev), torch.zeros(1 << 20, device=dev)
    c.all_gather(out, x)
    torch.cuda.synchronize(dev)
    done_before = c.all_gather(out, x, async_op=True)
    done_before.synchronize()
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000_000)  # about 5 s of GPU time before the call can start
    w = c.all_gather(out, x, async_op=True, stream=side)
    t0 = time.monotonic()
    with pytest.raises(ringcomm.TimeoutError, match="still running"):
        w.wait(timeout=0.2)  # bounded: the host waited 0.2 s, the call goes on
    assert time.monotonic() - t0 < 1.5
    with pytest.raises(ringcomm.TimeoutError, match="watchdog"):
        w.synchronize(timeout=60)  # the watchdog's 2 s, not this 60
    assert time.monotonic() - t0 < 10
    assert w.is_completed()
    assert isinstance(w.exception(), ringcomm.TimeoutError)
    with pytest.raises(ringcomm.RingcommError, match="watchdog"):
        w.wait()
    assert done_before.exception() is None  # finished before the error: not covered
    done_before.synchronize()
    with pytest.raises(ringcomm.RingcommError, match="unusable"):
        c.all_gather(out, x)
    t1 = time.monotonic()
    c.close()  # returns once the sleep ends (NCCL was aborted)
    assert time.monotonic() - t1 < 30
    side.synchronize()


def test_primary_context_detection():
    """Defect 6: DeviceGuard's check. A fresh process has no primary context on GPU 0
    until something creates one; a guard entered from a thread with no current device
    leaves it on the guarded device instead of "restoring" GPU 0."""
    out = _run_fresh("""
        import threading
        from ringcomm import _C
        assert _C._primary_context_active(0) is False, "a fresh process has no context"
        assert _C.cuda_device_count() >= 1  # initialises the driver, creates no context
        assert _C._primary_context_active(0) is False, "cuDevicePrimaryCtxGetState says active too early"
        import torch
        torch.zeros(1, device="cuda:0")
        assert _C._primary_context_active(0) is True
        # A guard of the current device changes nothing.
        assert _C._device_guard_probe(0) == (0, 0)
        print("ok")
    """)
    assert out.strip().endswith("ok")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (GPU 0 must stay untouched)")
def test_work_on_gpu_1_leaves_gpu_0_without_a_context():
    out = _run_fresh("""
        import threading
        from ringcomm import _C
        got = []
        t = threading.Thread(target=lambda: got.append(_C._device_guard_probe(1)))
        t.start(); t.join()
        assert got == [(1, 1)], got  # left on GPU 1: GPU 0 had no context to go back to
        assert _C._primary_context_active(0) is False, "the guard created a context on GPU 0"
        import torch
        torch.zeros(1, device="cuda:0")
        assert _C._device_guard_probe(1) == (1, 0)  # a real current device is restored
        print("ok")
    """)
    assert out.strip().endswith("ok")
