"""ZeRO step time with and without overlap (not a test: timings on a shared machine are noisy).

    python benchmarks/zero_overlap.py                    # world 2, stages 1-3
    python benchmarks/zero_overlap.py --world 4 --layer-ms 20

Model: --layers x [Linear(--width, --width), a layer that sleeps --layer-ms / 2 in
forward and --layer-ms in backward] (parallel_bench.py's stand-in for GPU kernels: the
compute leaves the cores free, so that what the overlap hides is visible on a CPU).
One step = forward + backward + step() of ZeroDataParallel; the time of a step is the
slowest rank's (a barrier starts every step), the figure the median over --steps.
Modes, interleaved step by step so that load changes hit all alike:

    overlap    overlap=True: stage 2 reduce-scatters each bucket from the gradient hooks,
               stage 3 also prefetches the next module's all_gather (forward and backward)
    serial     overlap=False: every reduce_scatter in step(), every gather on demand
    compute    forward + backward of an unwrapped copy (no communication)
    comm       the step's collectives alone, issued back to back on the same buffers

hidden = (serial - overlap) / comm: the fraction of the communication time the overlap
took off the step. Stage 1 reduces in step() in both modes (its row shows the noise).
"""
import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_bench import _sleeping_layer, run  # noqa: E402


def _rank(comm, stage, layers, width, batch, layer_ms, bucket_mb, steps, warmup, mixed):
    import torch
    import torch.nn as nn

    from ringcomm.parallel import ZeroDataParallel

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), _sleeping_layer(layer_ms))
                            for _ in range(layers)])
    plain = copy.deepcopy(model)
    z = ZeroDataParallel(model, comm, stage=stage, bucket_cap_mb=bucket_mb, lr=1e-4,
                         mixed_precision=mixed)
    dtype = z.compute_dtype
    plain = plain.to(dtype)
    x = torch.randn(batch, width, dtype=dtype)
    out = {m: [] for m in ("overlap", "serial", "compute", "comm")}
    for i in range(warmup + steps):
        for mode in out:
            comm.barrier()
            t0 = time.perf_counter()
            if mode == "compute":
                plain(x).float().square().mean().backward()
                plain.zero_grad()
            elif mode == "comm":
                works = []
                passes = 2 if stage == 3 else 1
                for u in z.units:
                    shard = torch.empty(u.shard, dtype=dtype)
                    full = torch.empty(u.padded, dtype=dtype)
                    for _ in range(passes):
                        works.append(comm.all_gather(full, shard, async_op=True))
                    works.append(comm.reduce_scatter(shard, full, async_op=True))
                for w in works:
                    w.wait()
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layer-ms", type=float, default=10.0)
    ap.add_argument("--bucket-mb", type=float, default=4.5)
    ap.add_argument("--bf16", action="store_true", help="mixed precision (bf16 compute and collectives)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    mixed = "bf16" if args.bf16 else None
    print(f"# ZeRO step, world {args.world}, {args.layers} x [Linear({args.width}, {args.width}) + "
          f"sleep {args.layer_ms / 2:g} ms fwd / {args.layer_ms:g} ms bwd], batch {args.batch}, "
          f"{'bf16' if mixed else 'fp32'}, buckets of {args.bucket_mb} MiB; median of {args.steps} "
          f"steps (slowest rank), modes interleaved")
    print(f"  {'stage':>5s} {'units':>5s} {'MiB':>6s} {'overlap ms':>10s} {'serial ms':>9s} "
          f"{'compute ms':>10s} {'comm ms':>8s} {'hidden':>7s}")
    for stage in args.stages:
        res = run(_rank, args.world, stage, args.layers, args.width, args.batch, args.layer_ms,
                  args.bucket_mb, args.steps, args.warmup, mixed)
        med = {m: statistics.median(max(ts) for ts in zip(*(r[m] for r in res)))
               for m in ("overlap", "serial", "compute", "comm")}
        hidden = (med["serial"] - med["overlap"]) / max(med["comm"], 1e-12)
        print(f"  {stage:>5d} {res[0]['units']:>5d} {res[0]['mb']:6.1f} {med['overlap'] * 1e3:10.1f} "
              f"{med['serial'] * 1e3:9.1f} {med['compute'] * 1e3:10.1f} {med['comm'] * 1e3:8.1f} "
              f"{hidden * 100:6.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
