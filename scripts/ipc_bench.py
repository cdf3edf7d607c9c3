"""The cuda_ipc transport's figures on one GPU, for scripts/gpu_check.sh:

1. the reduction kernels' throughput against the device-to-device copy bandwidth
   measured in the same run (bytes moved: a reduce reads two buffers and writes one,
   a copy reads one and writes one); target: at least 85% of the copy's bandwidth;
2. all_reduce latency from 8 B to 256 KiB (float32): NCCL at world size 1 (in this
   process), then `--world` ranks sharing the GPU over cuda_ipc, under one-shot,
   two-shot and the ring schedule; with the one-shot / two-shot thresholds these
   latencies suggest (RINGCOMM_IPC_ONESHOT_MAX_BYTES / RINGCOMM_IPC_TWOSHOT_MAX_BYTES).

    python scripts/ipc_bench.py [--quick] [--world N] [--json PATH]

The last line is the verdict: "IPC_BENCH: OK ..." or "IPC_BENCH: FAIL ..." (exit
status 0 / 1). Ranks sharing one GPU without MPS are time-sliced by the driver, so
their latencies measure hand-offs between processes, not the link; ranks on GPUs of
their own (a multi-GPU host) measure the transport.
"""

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

KERNEL_TARGET = 0.85
SIZES = [8 << (2 * i) for i in range(9)] + [256 << 10]  # 8 B .. 128 KiB by 4x, and 256 KiB
SIZES = sorted(set(s for s in SIZES if s <= 256 << 10))
IPC_ALGOS = ("oneshot", "twoshot", "ring")


# ---------------------------------------------------------------- pure helpers

def kernel_verdict(rows, target=KERNEL_TARGET):
    """rows: [(name, reduce GB/s, copy GB/s)]. Returns (ok, text)."""
    if not rows:
        return False, "no kernel figures"
    parts, ok = [], True
    for name, red, cp in rows:
        ratio = red / cp if cp > 0 else 0.0
        ok = ok and ratio >= target
        parts.append(f"{name} {ratio:.2f}x of copy ({red:.0f} vs {cp:.0f} GB/s)")
    return ok, "kernels " + ", ".join(parts) + f" (target {target:.2f}x)"


def suggest_thresholds(lat):
    """lat: {algo: {size: us}} with oneshot, twoshot, ring. The largest size up to
    which one-shot is the fastest, and then two-shot beats the ring (0: never)."""
    one = two = 0
    for s in sorted(lat.get("oneshot", {})):
        o, t, r = lat["oneshot"][s], lat.get("twoshot", {}).get(s), lat.get("ring", {}).get(s)
        if o <= min(x for x in (t, r) if x is not None):
            one = s
    for s in sorted(lat.get("twoshot", {})):
        t, r = lat["twoshot"][s], lat.get("ring", {}).get(s)
        if s > one and r is not None and t <= r:
            two = s
    return one, max(two, one)


def latency_table(lat, sizes):
    cols = [c for c in ("nccl_ws1", "oneshot", "twoshot", "ring") if c in lat]
    head = f"{'bytes':>8} " + " ".join(f"{c + ' us':>13}" for c in cols)
    lines = [head]
    for s in sizes:
        cells = []
        for c in cols:
            v = lat[c].get(s)
            cells.append(f"{v:13.1f}" if v is not None else f"{'-':>13}")
        lines.append(f"{s:>8} " + " ".join(cells))
    return lines


def pick(lat, algo, size):
    v = lat.get(algo, {}).get(size)
    return "-" if v is None else f"{v:.1f} us"


# ---------------------------------------------------------------- measurements

def _timed(torch, fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters  # us per call


def measure_kernels(quick):
    import torch

    from ringcomm import _C

    dev = torch.device("cuda", 0)
    n = (16 << 20) if quick else (64 << 20)
    rows = []
    stream = torch.cuda.current_stream(dev).cuda_stream
    for name, dtype, code in (("sum/float32", torch.float32, 2), ("sum/bfloat16", torch.bfloat16, 1)):
        a = torch.ones(n, dtype=dtype, device=dev)
        b = torch.ones(n, dtype=dtype, device=dev)
        c = torch.empty(n, dtype=dtype, device=dev)
        nbytes = n * a.element_size()
        for _ in range(3):
            c.copy_(a)
            _C.cuda_local_reduce(c.data_ptr(), a.data_ptr(), b.data_ptr(), n, code, 0, 1, stream)
        iters = 5 if quick else 20
        t_copy = min(_timed(torch, lambda: c.copy_(a), iters) for _ in range(3))
        t_red = min(_timed(torch, lambda: _C.cuda_local_reduce(c.data_ptr(), a.data_ptr(), b.data_ptr(), n, code,
                                                                0, 1, stream), iters) for _ in range(3))
        rows.append((name, 3 * nbytes / t_red / 1e3, 2 * nbytes / t_copy / 1e3))
    return rows


def _latency(comm, torch, algos, sizes, iters, reps):
    out = {}
    for algo in algos:
        out[algo] = {}
        for s in sizes:
            x = torch.ones(max(1, s // 4), dtype=torch.float32, device="cuda")
            for _ in range(3):
                comm.all_reduce(x, algo=algo)
            torch.cuda.synchronize()
            samples = []
            for _ in range(reps):
                comm.barrier()
                samples.append(_timed(torch, lambda: comm.all_reduce(x, algo=algo), iters))
            out[algo][s] = statistics.median(samples)
    return out


def measure_nccl_ws1(sizes, quick):
    import torch
    from torch.distributed import HashStore

    import ringcomm

    comm = ringcomm.init(rank=0, world_size=1, store=HashStore(), transport="auto")
    try:
        return _latency(comm, torch, ["nccl"], sizes, 20 if quick else 100, 3 if quick else 5)["nccl"]
    finally:
        comm.close()


def _rank(rank, world, port, sizes, quick, q):
    try:
        import torch
        import torch.distributed as dist

        import ringcomm

        torch.cuda.set_device(0)
        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=120))
        comm = ringcomm.init(rank=rank, world_size=world, store=store, timeout=60, transport="cuda_ipc")
        try:
            lat = _latency(comm, torch, IPC_ALGOS, sizes, 5 if quick else 20, 3)
        finally:
            comm.close()
        q.put((rank, True, lat))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, False, f"{type(e).__name__}: {e}"))


def measure_ipc(world, sizes, quick, timeout_s):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, sizes, quick, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + timeout_s
    try:
        while len(got) < world and time.monotonic() < deadline:
            try:
                r, ok, payload = q.get(timeout=1)
            except Exception:  # noqa: BLE001 (queue.Empty)
                if any(p.exitcode not in (None, 0) for p in procs):
                    break
                continue
            got[r] = (ok, payload)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    errors = [f"rank {r}: {v[1]}" for r, v in sorted(got.items()) if not v[0]]
    if len(got) < world:
        errors.append(f"ranks {sorted(set(range(world)) - set(got))} did not report within {timeout_s:.0f} s")
    if errors:
        return None, errors
    # The time of a call is the slowest rank's.
    lat = {a: {s: max(got[r][1][a][s] for r in range(world)) for s in sizes} for a in IPC_ALGOS}
    return lat, []


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--ipc-timeout", type=float, default=150.0)
    a = ap.parse_args(argv)
    problems, facts = [], {}
    sizes = SIZES[::2] + [SIZES[-1]] if a.quick else SIZES
    rows = measure_kernels(a.quick)
    ok_k, ktext = kernel_verdict(rows)
    print("== reduction kernels vs device-to-device copy (same run)")
    for name, red, cp in rows:
        print(f"  {name:14} reduce {red:8.1f} GB/s   copy {cp:8.1f} GB/s   {red / cp:.2f}x")
    if not ok_k:
        problems.append(ktext)
    facts["kernels"] = rows
    lat = {"nccl_ws1": measure_nccl_ws1(sizes, a.quick)}
    ipc, errors = measure_ipc(a.world, sizes, a.quick, a.ipc_timeout)
    problems += errors
    if ipc:
        lat.update(ipc)
    print(f"== all_reduce float32 latency: NCCL at world size 1; cuda_ipc at world size {a.world} on one GPU")
    for line in latency_table(lat, sizes):
        print("  " + line)
    one = two = None
    if ipc:
        one, two = suggest_thresholds(ipc)
        print(f"  suggested: RINGCOMM_IPC_ONESHOT_MAX_BYTES={one} RINGCOMM_IPC_TWOSHOT_MAX_BYTES={two}")
    facts.update({"latency_us": {k: {str(s): v for s, v in d.items()} for k, d in lat.items()},
                  "suggested": [one, two], "problems": problems})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(facts, f, indent=1)
    s0 = sizes[0]
    summary = (f"{ktext}; {s0} B all_reduce: oneshot {pick(lat, 'oneshot', s0)} (ws {a.world}), "
               f"ring {pick(lat, 'ring', s0)}, nccl ws1 {pick(lat, 'nccl_ws1', s0)}")
    if problems:
        print("IPC_BENCH: FAIL " + "; ".join(p[:300] for p in problems))
        return 1
    print("IPC_BENCH: OK " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
