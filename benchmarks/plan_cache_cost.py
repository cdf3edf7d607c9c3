"""What the plan cache saves per call (not a test: timings on a shared machine are noisy).

    python benchmarks/plan_cache_cost.py [--world 2] [--calls 4000] [--launches 3]

Per-call time of small collectives (all_reduce forced to the ring here:
RINGCOMM_ALGO=all_reduce:ring for every launch, as it was measured before small
all_reduce calls ran their one-shot plan inline too; the other ops pick), with the cache
on (RINGCOMM_PLAN_CACHE unset: 64 plans) and off (RINGCOMM_PLAN_CACHE=0). Launches
alternate on/off so that drift hits both alike; each figure is the median over launches
of the median of 5 batches of --calls calls (slowest rank). Fresh numpy buffers every
batch: a kept plan runs on them as it stands.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_bench import run  # noqa: E402

CASES = ("all_reduce 4 B ring", "all_reduce 4 B async", "all_reduce 64 KiB ring",
         "broadcast 4 B", "all_gather 4 B", "reduce_scatter 4 B")


def _rank(comm, calls):
    import numpy as np

    n = comm.world_size
    out = {}
    for case in CASES:
        batches = []
        for _ in range(6):
            small = np.ones(1, dtype=np.float32)
            big = np.ones(16384, dtype=np.float32)
            gathered = np.empty(n, dtype=np.float32)
            rs_in = np.ones(n, dtype=np.float32)
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                if case == "all_reduce 4 B async":
                    comm.all_reduce(small, async_op=True).wait()
                elif case == "all_reduce 4 B ring":
                    comm.all_reduce(small)
                elif case == "all_reduce 64 KiB ring":
                    comm.all_reduce(big)
                elif case == "broadcast 4 B":
                    comm.broadcast(small, src=0)
                elif case == "all_gather 4 B":
                    comm.all_gather(gathered, small)
                else:
                    comm.reduce_scatter(small, rs_in)
            batches.append((time.perf_counter() - t0) / calls)
        out[case] = statistics.median(batches[1:])  # the first batch warms up
    out["stats"] = comm.plan_cache_stats()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--launches", type=int, default=3)
    args = ap.parse_args(argv)
    from ringcomm.bench.report import _cpu_model

    os.environ["RINGCOMM_ALGO"] = "all_reduce:ring"
    times = {"on": {c: [] for c in CASES}, "off": {c: [] for c in CASES}}
    stats = {}
    for _ in range(args.launches):
        for mode in ("on", "off"):
            saved = os.environ.pop("RINGCOMM_PLAN_CACHE", None)
            if mode == "off":
                os.environ["RINGCOMM_PLAN_CACHE"] = "0"
            try:
                res = run(_rank, args.world, args.calls)
            finally:
                os.environ.pop("RINGCOMM_PLAN_CACHE", None)
                if saved is not None:
                    os.environ["RINGCOMM_PLAN_CACHE"] = saved
            for c in CASES:
                times[mode][c].append(max(r[c] for r in res))
            stats[mode] = res[0]["stats"]
    print(f"# plan cache on (64 plans) vs off (RINGCOMM_PLAN_CACHE=0), world {args.world}, shared "
          f"memory, RINGCOMM_ALGO=all_reduce:ring; per call, median over {args.launches} launches (alternating) of the median of 5 "
          f"batches of {args.calls} calls, slowest rank")
    print(f"# CPU: {_cpu_model()}")
    print(f"# rank 0's cache at the end of the last 'on' launch: {stats['on']}")
    print(f"  {'call':<24s} {'on us':>8s} {'off us':>8s} {'off/on':>7s}   launches on / off (us)")
    for c in CASES:
        on, off = statistics.median(times["on"][c]), statistics.median(times["off"][c])
        each = " ".join(f"{a * 1e6:.2f}/{b * 1e6:.2f}" for a, b in zip(times["on"][c], times["off"][c]))
        print(f"  {c:<24s} {on * 1e6:8.2f} {off * 1e6:8.2f} {off / on:7.2f}   {each}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
