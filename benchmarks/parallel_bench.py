"""Measurements for ringcomm.parallel (not tests: timings on a shared machine are noisy).

    python benchmarks/parallel_bench.py dp        # DP step: overlapped vs reduce-after-backward
    python benchmarks/parallel_bench.py bubble    # pipeline bubble vs (S-1)/(K+S-1)
    python benchmarks/parallel_bench.py all

dp: world size 2 (--world), an MLP of --layers Linear(--width, --width) layers,
batch --batch, buckets of --bucket-mb. One step = forward + backward + finish();
the time of a step is the slowest rank's (a barrier starts every step), and the
figure is the median over --steps steps. Rows: overlap (each bucket's all_reduce
issued from the post-accumulate-grad hook), after backward (every all_reduce issued
in finish()), and for scale the same step with no communication at all and the
all_reduces alone; the modes alternate step by step so load changes hit all alike.
On the shared-memory path the all_reduce is CPU work (copies and sums), so with
every core busy computing it can only take CPU time from backward; --layer-ms adds
compute that leaves the CPU free (a sleeping layer, as a GPU kernel occupies the
device and not the host), which shows what the overlap hides when cores are idle.

bubble: S stages (S ranks), K micro-batches, every stage spends t_f per forward and
2 t_f per backward (--stage-ms; sleeping by default, so that S ranks on fewer cores
still run in parallel; --compute matmul burns CPU instead). Every step starts at a
barrier and lasts until its last stage is done (the makespan); the bubble is the
fraction of the makespan a stage does not compute, 1 - compute / makespan, averaged
over stages and over --steps steps, next to the model (S-1)/(K+S-1).
"""
import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import traceback
from datetime import timedelta


# ----------------------------------------------------------------- launching

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, fn, args, q):
    try:
        import torch
        import torch.distributed as dist

        import ringcomm

        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=120))
        comm = ringcomm.init(rank=rank, world_size=world, store=store, timeout=120.0)
        q.put((rank, True, fn(comm, *args)))
        comm.close()
        store.add("done", 1)
        if rank == 0:  # the store's host leaves last
            deadline = time.monotonic() + 10
            while store.add("done", 0) < world and time.monotonic() < deadline:
                time.sleep(0.01)
    except BaseException:
        q.put((rank, False, traceback.format_exc()))


def run(fn, world, *args, timeout=600):
    """fn(comm, *args) on `world` spawned ranks; the results by rank."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, fn, args, q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    if env_before is None:
        del os.environ["OMP_NUM_THREADS"]
    results = {}
    try:
        deadline = time.monotonic() + timeout
        while len(results) < world:
            rank, ok, payload = q.get(timeout=max(1.0, deadline - time.monotonic()))
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{payload}")
            results[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=15)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]


# ------------------------------------------------------------------------ DP

MODES = (("overlap", "overlapped (all_reduce from the grad hooks)"),
         ("after", "all_reduce after backward (overlap=False)"),
         ("none", "forward + backward, no communication"),
         ("comm", "the bucket all_reduces alone"))


def _sleeping_layer(layer_ms):
    """A layer that holds no CPU: it sleeps layer_ms / 2 forward and layer_ms backward,
    as a GPU kernel would keep the device, not the host, busy."""
    import torch
    import torch.nn as nn

    class Sleep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            time.sleep(layer_ms / 2e3)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            time.sleep(layer_ms / 1e3)
            return g

    class SleepLayer(nn.Module):
        def forward(self, x):
            return Sleep.apply(x)

    return SleepLayer()


def _dp_rank(comm, layers, width, batch, bucket_mb, steps, warmup, layer_ms=0.0):
    """Every mode in turn, step by step, so that load changes on the machine hit all
    modes alike. Returns {mode: [seconds per step]}, plus "backward:<mode>" (seconds
    until backward() returned) and "done_at_backward_end" (buckets whose all_reduce had
    already completed when backward returned, overlap mode) and "buckets"."""
    import torch
    import torch.nn as nn

    from ringcomm.parallel import DataParallel

    torch.manual_seed(0)
    def layer():
        parts = [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*parts, *([_sleeping_layer(layer_ms)] if layer_ms else []))

    model = nn.Sequential(*[layer() for _ in range(layers)])
    x = torch.randn(batch, width)
    dp = DataParallel(model, comm, bucket_cap_mb=bucket_mb)
    times = {mode: [] for mode, _ in MODES}
    times.update({"backward:overlap": [], "backward:after": [], "backward:none": [],
                  "done_at_backward_end": [], "buckets": [len(dp.buckets)]})
    for i in range(warmup + steps):
        for mode, _ in MODES:
            dp.zero_grad(set_to_none=False)
            dp.overlap = mode == "overlap"
            comm.barrier()
            t0 = time.perf_counter()
            if mode == "comm":
                works = [comm.all_reduce(b.flat, op="avg", async_op=True) for b in dp.buckets]
                for w in works:
                    w.wait()
            elif mode == "none":
                with dp.no_sync():  # hooks only move gradients into the buckets
                    dp(x).square().mean().backward()
                t_bwd = time.perf_counter()
            else:
                dp(x).square().mean().backward()
                t_bwd = time.perf_counter()
                done = sum(1 for b in dp.buckets if b.work is not None and b.work.is_completed())
                dp.finish()
            if i >= warmup:
                times[mode].append(time.perf_counter() - t0)
                if mode != "comm":
                    times[f"backward:{mode}"].append(t_bwd - t0)
                if mode == "overlap":
                    times["done_at_backward_end"].append(done)
    return times


def bench_dp(args):
    world = args.world
    nparams = args.layers * (args.width * args.width + args.width)
    sleeping = (f", each layer also sleeping {args.layer_ms / 2:g} ms forward and {args.layer_ms:g} ms "
                f"backward (compute that leaves the CPU free, as on a GPU)" if args.layer_ms else "")
    print(f"# DP step, world size {world}, CPU: {args.layers} x Linear({args.width}, {args.width})"
          f"{sleeping}, batch {args.batch}, {nparams * 4 / 2 ** 20:.1f} MiB of fp32 gradients, "
          f"buckets of {args.bucket_mb} MiB; modes interleaved step by step; median of "
          f"{args.steps} steps (slowest rank)")
    per_rank = run(_dp_rank, world, args.layers, args.width, args.batch, args.bucket_mb,
                   args.steps, args.warmup, args.layer_ms)
    out = {}
    for mode, label in MODES:
        step = sorted(max(ts) for ts in zip(*(r[mode] for r in per_rank)))
        out[mode] = statistics.median(step)
        print(f"  {label:<46s} {out[mode] * 1e3:8.1f} ms  (p10 {step[len(step) // 10] * 1e3:.1f},"
              f" p90 {step[(9 * len(step)) // 10] * 1e3:.1f})")
    bwd = {m: statistics.median(max(ts) for ts in zip(*(r[f"backward:{m}"] for r in per_rank)))
           for m in ("overlap", "after", "none")}
    done = statistics.mean(d for r in per_rank for d in r["done_at_backward_end"])
    print(f"  forward+backward alone took {bwd['overlap'] * 1e3:.1f} ms with overlap, "
          f"{bwd['after'] * 1e3:.1f} ms without, {bwd['none'] * 1e3:.1f} ms with no communication; "
          f"{done:.1f} of {per_rank[0]['buckets'][0]} buckets were already reduced when "
          f"backward returned")
    saved = out["after"] - out["overlap"]
    print(f"  overlap saves {saved * 1e3:.1f} ms per step ({saved / out['after'] * 100:.0f}%), "
          f"{saved / max(out['comm'], 1e-12) * 100:.0f}% of the communication time; "
          f"bound max(compute, comm) = {max(out['none'], out['comm']) * 1e3:.1f} ms")
    return out


# -------------------------------------------------------------------- bubble

def _pp_rank(comm, ks, stage_ms, compute, steps, warmup):
    """Every (K, schedule) on this group of S ranks:
    {(K, schedule): ([(compute s, step s) per step], peak in flight)}."""
    import torch
    import torch.nn as nn

    from ringcomm.parallel import Pipeline

    t_f = stage_ms / 1e3

    def work(seconds):
        if compute == "sleep":
            time.sleep(seconds)
        else:  # burn CPU for about `seconds`
            end = time.perf_counter() + seconds
            a = torch.ones(64, 64)
            while time.perf_counter() < end:
                a = (a @ a).clamp_(-1, 1)

    class Busy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            work(t_f)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            work(2 * t_f)
            return g

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x):
            return Busy.apply(x.float() * self.w)

    out = {}
    for k in ks:
        for schedule in ("gpipe", "1f1b"):
            pipe = Pipeline(Stage(), comm, schedule, k, loss_fn=lambda y, t: (y - t).square().mean())
            x = torch.zeros(k, 16)
            samples = []
            for i in range(warmup + steps):
                comm.barrier()
                pipe.step(x if pipe.is_first else None, x if pipe.is_last else None)
                if i >= warmup:
                    samples.append((pipe.stats["compute_s"], pipe.stats["step_s"]))
            out[(k, schedule)] = (samples, pipe.max_in_flight)
    return out


def bench_bubble(args):
    print(f"# pipeline bubble, CPU: every stage {args.stage_ms} ms forward + {2 * args.stage_ms} ms "
          f"backward per micro-batch ({args.compute}); bubble = 1 - compute/makespan of the "
          f"step (mean over stages), mean of {args.steps} steps; ideal step = (K+S-1)(t_f+t_b)")
    print(f"  {'S':>2s} {'K':>3s} {'schedule':>8s} {'model':>7s} {'measured':>8s} {'step ms':>8s} "
          f"{'ideal ms':>8s}  peak in flight per stage")
    out = []
    for s in args.stages:
        res = run(_pp_rank, s, args.microbatches, args.stage_ms, args.compute, args.steps, args.warmup)
        for k in args.microbatches:
            for schedule in ("gpipe", "1f1b"):
                # All stages start a step at a barrier; the step lasts until the last
                # stage is done (its makespan), and every stage computes the same amount.
                per_step = list(zip(*(r[(k, schedule)][0] for r in res)))
                makespans = [max(st for _, st in ranks) for ranks in per_step]
                bubble = statistics.mean(1 - statistics.mean(c for c, _ in ranks) / m
                                         for ranks, m in zip(per_step, makespans))
                step = statistics.median(makespans)
                peaks = [r[(k, schedule)][1] for r in res]
                model = (s - 1) / (k + s - 1)
                ideal = (k + s - 1) * 3 * args.stage_ms
                print(f"  {s:>2d} {k:>3d} {schedule:>8s} {model:7.3f} {bubble:8.3f} {step * 1e3:8.1f} "
                      f"{ideal:8.1f}  {peaks}", flush=True)
                out.append((s, k, schedule, model, bubble, step))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="ringcomm.parallel measurements")
    ap.add_argument("what", choices=("dp", "bubble", "all"))
    ap.add_argument("--world", type=int, default=2, help="dp: world size")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--bucket-mb", type=float, default=4.5)
    ap.add_argument("--layer-ms", type=float, default=0.0,
                    help="dp: add a layer that sleeps this long in backward (half in forward)")
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--stage-ms", type=float, default=4.0)
    ap.add_argument("--compute", choices=("sleep", "matmul"), default="sleep")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    if args.what in ("dp", "all"):
        bench_dp(args)
    if args.what in ("bubble", "all"):
        bench_bubble(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
