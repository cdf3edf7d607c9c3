"""ZeRO step time with and without overlap (not a test: timings on a shared machine are noisy).

    python benchmarks/zero_overlap.py                    # world 2, stages 2 and 3
    python benchmarks/zero_overlap.py --world 4 --layer-ms 20

Model: --layers x [Linear(--width, --width), a layer that sleeps --layer-ms / 2 in
forward and --layer-ms in backward] (parallel_bench.py's stand-in for GPU kernels: the
compute leaves the cores free, so that what the overlap hides is visible on a CPU).
One step = forward + backward + step() of ZeroDataParallel; the time of a step is the
slowest rank's (a barrier starts every step). Modes, interleaved step by step so that
load changes hit all alike:

    overlap    overlap=True: stage 2 reduce-scatters each bucket from the gradient hooks,
               stage 3 also prefetches the next module's all_gather (forward and backward)
    serial     overlap=False: every reduce_scatter in step(), every gather on demand
    compute    forward + backward of an unwrapped copy (no communication)
    rs, ag     the step's reduce_scatters alone / its all_gathers alone, back to back on
               the same sizes (stage 3 gathers every unit twice: forward and backward)

What the overlap can hide: stage 2's reduce_scatters (its all_gather of the updated
parameters follows the optimizer step, and nothing is left to overlap it with), stage
3's reduce_scatters and both passes of gathers. Not all of it, even in principle: the
last bucket's reduce_scatter starts when backward ends, and the first gather of each
pass has nothing before it to hide behind, so the bound is about (units - 1) / units.

    saved      median over steps of (serial - overlap), paired step by step (the two
               modes of one step run back to back), and in how many steps overlap won
    hidden     saved / hideable: the fraction of the hideable communication the overlap
               took off the step
    bound      (units - 1) / units: what a perfect overlap would reach

Stage 1 reduces in step() in both modes (--stages 1 shows the noise of the machine).

Allocator. torch's CPU allocator hands large blocks back to the OS, so every fresh
bucket, reduce output and gathered copy page-faults on first touch (measured ~0.3 ms
per MiB here: the reduce_scatters alone went from 44 to 22 ms per step). A GPU's
caching allocator keeps its blocks, so by default the ranks run with glibc told to do
the same (MALLOC_MMAP_THRESHOLD_=32 MiB, MALLOC_TRIM_THRESHOLD_=16 GiB: freed blocks
stay in the heap); --os-malloc leaves glibc's defaults (what a CPU job gets).
"""
import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_bench import _sleeping_layer, run  # noqa: E402

MODES = ("overlap", "serial", "compute", "rs", "ag")


def _comm_alone(comm, z, dtype, kind, passes):
    import torch

    works = []
    for _ in range(passes):
        for u in z.units:
            shard = torch.empty(u.shard, dtype=dtype)
            full = torch.empty(u.padded, dtype=dtype)
            if kind == "rs":
                works.append(comm.reduce_scatter(shard, full, async_op=True))
            else:
                works.append(comm.all_gather(full, shard, async_op=True))
    for w in works:
        w.wait()


def _rank(comm, stage, layers, width, batch, layer_ms, bucket_mb, steps, warmup, mixed, optimizer):
    import torch
    import torch.nn as nn

    from ringcomm.parallel import ZeroDataParallel

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), _sleeping_layer(layer_ms))
                            for _ in range(layers)])
    plain = copy.deepcopy(model)
    opt_class = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[optimizer]
    z = ZeroDataParallel(model, comm, stage=stage, bucket_cap_mb=bucket_mb, lr=1e-4,
                         optimizer_class=opt_class, mixed_precision=mixed)
    dtype = z.compute_dtype
    plain = plain.to(dtype)
    x = torch.randn(batch, width, dtype=dtype)
    out = {m: [] for m in MODES}
    for i in range(warmup + steps):
        # overlap and serial swap places every step: the one that runs first after the
        # others' allocations pays the page faults of fresh buckets (measured ~10 ms)
        pair = ("overlap", "serial") if i % 2 == 0 else ("serial", "overlap")
        for mode in ("compute", "rs", "ag") + pair:
            comm.barrier()
            t0 = time.perf_counter()
            if mode == "compute":
                plain(x).float().square().mean().backward()
                plain.zero_grad()
            elif mode in ("rs", "ag"):
                _comm_alone(comm, z, dtype, mode, 2 if mode == "ag" and stage == 3 else 1)
            else:
                z.overlap = mode == "overlap"
                z(x).float().square().mean().backward()
                z.step()
                z.zero_grad()
            if i >= warmup:
                out[mode].append(time.perf_counter() - t0)
    out["units"] = len(z.units)
    out["mb"] = sum(u.padded for u in z.units) * torch.empty((), dtype=dtype).element_size() / 2 ** 20
    return out


def summarise(res, stage):
    """The figures of one stage from every rank's per-step times (slowest rank per step)."""
    slow = {m: [max(ts) for ts in zip(*(r[m] for r in res))] for m in MODES}
    med = {m: statistics.median(v) for m, v in slow.items()}
    diffs = [s - o for s, o in zip(slow["serial"], slow["overlap"])]
    hideable = med["rs"] + (med["ag"] if stage == 3 else 0.0)
    units = res[0]["units"]
    saved = statistics.median(diffs)
    q = statistics.quantiles(diffs, n=4) if len(diffs) >= 4 else [min(diffs), saved, max(diffs)]
    return {
        "units": units, "mb": res[0]["mb"], **{m: med[m] for m in MODES},
        "saved": saved, "saved_q1": q[0], "saved_q3": q[2],
        "wins": sum(d > 0 for d in diffs), "steps": len(diffs),
        "hideable": hideable, "hidden": saved / max(hideable, 1e-12),
        "bound": (units - 1) / units if stage != 1 else 0.0,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4,
                    help="small: the matmuls then take little CPU, which the collectives need")
    ap.add_argument("--layer-ms", type=float, default=10.0)
    ap.add_argument("--bucket-mb", type=float, default=16.5,
                    help="one Linear(2048, 2048) per bucket at the default width")
    ap.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                    help="sgd: the cheapest step, so that the step's noise is the smallest")
    ap.add_argument("--bf16", action="store_true", help="mixed precision (bf16 compute and collectives)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--os-malloc", action="store_true",
                    help="glibc's default allocator settings (large blocks go back to the OS)")
    args = ap.parse_args(argv)
    mixed = "bf16" if args.bf16 else None
    if not args.os_malloc:  # inherited by the spawned ranks; glibc reads them at start
        os.environ.update(MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(16 << 30))
    malloc = ("glibc defaults (--os-malloc)" if args.os_malloc else
              "freed blocks kept, as a caching allocator (MALLOC_MMAP_THRESHOLD_=32 MiB, "
              "MALLOC_TRIM_THRESHOLD_=16 GiB)")
    from ringcomm.bench.report import _cpu_model

    print(f"# ZeRO step, world {args.world}, {args.layers} x [Linear({args.width}, {args.width}) + "
          f"sleep {args.layer_ms / 2:g} ms fwd / {args.layer_ms:g} ms bwd], batch {args.batch}, "
          f"{'bf16' if mixed else 'fp32'}, {args.optimizer}, buckets of {args.bucket_mb} MiB; "
          f"medians of {args.steps} steps (slowest rank), modes interleaved step by step")
    print(f"# CPU: {_cpu_model()}; allocator: {malloc}")
    print(f"  {'stage':>5s} {'units':>5s} {'MiB':>6s} {'overlap':>8s} {'serial':>8s} {'compute':>8s} "
          f"{'rs':>7s} {'ag':>7s} {'hideable':>8s} {'saved (IQR)':>20s} {'won':>7s} {'hidden':>7s} "
          f"{'bound':>6s}")
    print(f"  {'':>5s} {'':>5s} {'':>6s} {'ms':>8s} {'ms':>8s} {'ms':>8s} {'ms':>7s} {'ms':>7s} "
          f"{'ms':>8s} {'ms':>20s}")
    for stage in args.stages:
        res = run(_rank, args.world, stage, args.layers, args.width, args.batch, args.layer_ms,
                  args.bucket_mb, args.steps, args.warmup, mixed, args.optimizer)
        s = summarise(res, stage)
        iqr = f"{s['saved'] * 1e3:.1f} ({s['saved_q1'] * 1e3:.1f}..{s['saved_q3'] * 1e3:.1f})"
        print(f"  {stage:>5d} {s['units']:>5d} {s['mb']:6.1f} {s['overlap'] * 1e3:8.1f} "
              f"{s['serial'] * 1e3:8.1f} {s['compute'] * 1e3:8.1f} {s['rs'] * 1e3:7.1f} "
              f"{s['ag'] * 1e3:7.1f} {s['hideable'] * 1e3:8.1f} {iqr:>20s} "
              f"{s['wins']:>3d}/{s['steps']:<3d} {s['hidden'] * 100:6.0f}% {s['bound'] * 100:5.0f}%",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
