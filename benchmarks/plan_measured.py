"""The planner against measured training on this machine: every TP x PP x DP layout
(each in {1, 2, 4}), ZeRO 0-3 and 1-8 micro-batches of examples/train_3d.py at world 4
and 8, predicted step time and memory per rank beside the measured ones.

    python benchmarks/plan_measured.py --world 4 --world 8 [--steps 8] [--passes 2] [--json out.json]

Each world is one spawned group of ranks (torch's import is paid once); it first
measures this machine as the planner's Cluster (Cluster.measured_here: the model's
GEMMs, one layer's forward and backward, a two-layer model, the copy bandwidth and an
AdamW step with a core to itself and again with every rank at once (Cluster.shared:
the node's work as it runs together), the wait a collective adds between bursts of
compute, what a ZeRO 3 unit's gather or reduction adds, the links of the
communicator's own cost model), then trains every layout for --steps steps (fp32,
AdamW, 1F1B; the first step warms up, the others are timed from a barrier, the
slowest rank's time), --passes times over, odd passes in reverse order, and measures
the cluster again after each pass: a layout's step time is the median of its timed
steps over the passes, the cluster the mean of its measurements (the machine's speed
drifts over a run; the output prints how far the last measurement is from the first).
Memory: each rank's peak C-heap bytes in use during step 1 of the first pass above what
it held before building its model (ringcomm.bench.heap), the largest over ranks,
against the planner's total for the first stage's device (the fullest). The pick: the
planner's fastest layout, and its measured time against the fastest measured.
"""
import argparse
import json
import os
import platform
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from parallel_bench import run  # noqa: E402

MODEL = dict(vocab=512, hidden=256, heads=4, layers=6, seq=32)
GLOBAL_BATCH = 32
MICROBATCHES = (1, 2, 4, 8)


def layouts(world):
    out = []
    for tp in (1, 2, 4):
        for pp in (1, 2, 4):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if dp not in (1, 2, 4):
                continue
            for zero in ((0, 1, 2, 3) if dp > 1 else (0,)):
                for m in MICROBATCHES:
                    if GLOBAL_BATCH % (dp * m):
                        continue
                    out.append((tp, pp, dp, zero, m))
    return out


def _rank(comm, steps, only, passes=1):
    import torch

    import train_3d
    from ringcomm.parallel import Cluster, Transformer

    model = Transformer(MODEL["layers"], MODEL["hidden"], MODEL["heads"], MODEL["seq"], MODEL["vocab"], tied=False)

    def calibrate():
        return Cluster.measured_here(comm, model, precision="fp32", seconds=1.0).as_dict()

    clusters = [calibrate()]
    todo = only or layouts(comm.world_size)
    rows = {}
    for n in range(passes):
        # Every pass trains every layout; odd passes in reverse order (a drift of the
        # machine's speed then falls on early and late layouts alike).
        for (tp, pp, dp, zero, m) in (todo if n % 2 == 0 else todo[::-1]):
            rep = {"measure": True}
            train_3d.train(comm, tp, pp, dp, zero=zero, report=rep, steps=steps, microbatches=m,
                           batch=GLOBAL_BATCH, **MODEL)
            row = rows.get((tp, pp, dp, zero, m))
            if row is None:  # memory: the first pass's (the later ones reuse what it allocated)
                peak = torch.tensor([float(rep["peak_bytes"])], dtype=torch.float64)
                comm.all_reduce(peak, op="max")
                row = rows[(tp, pp, dp, zero, m)] = {
                    "tp": tp, "pp": pp, "dp": dp, "zero": zero, "microbatches": m, "step_s": rep["step_s"],
                    "step_s_passes": [], "peak_bytes": float(peak), "own_peak_bytes": rep["peak_bytes"]}
            row["step_s_passes"].append(rep["step_s"])
        clusters.append(calibrate())
    return {"cluster": _mean(clusters), "clusters": clusters, "before": clusters[0], "after": clusters[-1],
            "rows": [rows[k] for k in todo]}


def _mean(xs):
    """The mean of measurements of the cluster (numbers averaged, the rest: the first's)."""
    a = xs[0]
    if isinstance(a, dict) and all(isinstance(x, dict) and x.keys() == a.keys() for x in xs):
        return {k: _mean([x[k] for x in xs]) for k in a}
    if all(isinstance(x, float) for x in xs):
        return sum(xs) / len(xs)
    return a


def measured_seconds(row):
    """A layout's step time: the median of every pass's timed steps (the first step of a
    pass warms up)."""
    runs = row.get("step_s_passes") or [row["step_s"]]
    return statistics.median([t for run in runs for t in run[1:]])


def predict(world, cluster_info, row):
    from ringcomm.parallel import Cluster, Transformer, plan

    model = Transformer(MODEL["layers"], MODEL["hidden"], MODEL["heads"], MODEL["seq"], MODEL["vocab"], tied=False)
    cluster = Cluster(**cluster_info)
    b = GLOBAL_BATCH // (row["dp"] * row["microbatches"])
    got = plan(model, cluster, GLOBAL_BATCH, tp=row["tp"], pp=row["pp"], zero_stage=row["zero"], micro_batch=b,
               recompute=False, precision="fp32", activations="fused", runtime="ringcomm",
               max_micro_batch=GLOBAL_BATCH)
    assert len(got) == 1, got
    return got[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, action="append", help="world sizes (default 4 and 8)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--passes", type=int, default=1,
                    help="train every layout this many times, alternating the order, and calibrate after each "
                         "pass (the step time: the median over the passes' steps; the cluster: the mean)")
    ap.add_argument("--json", help="write every row (measured and predicted) here")
    ap.add_argument("--only", help="tp,pp,dp,zero,m[;...]: just these layouts")
    ap.add_argument("--measured", help="predict against the measurements of an earlier --json instead of "
                                       "training again")
    args = ap.parse_args(argv)
    import torch  # noqa: F401  (its version in the header)

    from ringcomm.bench.report import machine_facts

    only = [tuple(int(x) for x in item.split(",")) for item in args.only.split(";")] if args.only else None
    print(f"# python benchmarks/plan_measured.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    facts = machine_facts()
    print(f"# CPU: {facts['cpu_model']}, {os.cpu_count()} CPUs; torch {facts.get('torch')}; {platform.python_version()}; model {MODEL}, "
          f"global batch {GLOBAL_BATCH}, fp32 AdamW, 1F1B")
    every = []
    raw = []
    earlier = {}
    if args.measured:
        with open(args.measured) as f:
            for r in json.load(f):
                earlier.setdefault(r["world"], {"cluster": r["cluster"], "rows": []})["rows"].append(r)
    for world in args.world or ([*earlier] if earlier else [4, 8]):
        if world in earlier:
            res = [earlier[world]]
        else:
            res = run(_rank, world, args.steps, only, args.passes, timeout=7200)
            # The measurements first, every world's so far: a planner change can be checked against them.
            raw += [dict(r, world=world, cluster=res[0]["cluster"], cluster_before=res[0]["before"],
                         cluster_after=res[0]["after"]) for r in res[0]["rows"]]
            if args.json:
                with open(args.json + ".raw", "w") as f:
                    json.dump(raw, f)
        info = res[0]["cluster"]
        spread = {"cluster_before": res[0]["before"], "cluster_after": res[0]["after"]} if "before" in res[0] else {}
        print(f"# world {world}: measured here (the mean of the measurements before the training and after each "
              f"pass): {json.dumps(info)}")
        if spread:
            a, b = spread["cluster_before"], spread["cluster_after"]
            keys = [k for k in ("peak_tflops", "memory_passes", "layer_overhead_seconds", "microbatch_overhead_seconds",
                                "optimizer_seconds_per_param", "sync_seconds", "zero3_unit_seconds") if a.get(k)]
            drift = ", ".join(f"{k} {b[k] / a[k] - 1:+.0%}" for k in keys)
            sa, sb = a.get("shared") or {}, b.get("shared") or {}
            drift += ", shared: " + ", ".join(f"{k} {sb[k] / sa[k] - 1:+.0%}" for k in sa if sa[k] and sb.get(k))
            print(f"# world {world}: after against before: {drift}")
        print(f"{'tp':>3} {'pp':>3} {'dp':>3} {'zero':>4} {'m':>2} {'b':>2} | {'measured ms':>11} {'predicted':>9} "
              f"{'err':>6} | {'measured MB':>11} {'predicted':>9} {'err':>6}")
        rows = []
        for row in res[0]["rows"]:
            lay = predict(world, info, row)
            meas = measured_seconds(row)
            pred = lay.step_seconds
            mem = row["peak_bytes"]
            pmem = lay.memory_bytes["total"]
            r = dict(row, **spread, world=world, cluster=info, measured_s=meas, predicted_s=pred, predicted_bytes=pmem,
                     predicted_memory=lay.memory_bytes, time_error=pred / meas - 1, memory_error=pmem / mem - 1)
            rows.append(r)
            print(f"{row['tp']:>3} {row['pp']:>3} {row['dp']:>3} {row['zero']:>4} {row['microbatches']:>2} "
                  f"{GLOBAL_BATCH // (row['dp'] * row['microbatches']):>2} | {meas * 1e3:>11.1f} {pred * 1e3:>9.1f} "
                  f"{r['time_error']:>+6.1%} | {mem / 1e6:>11.2f} {pmem / 1e6:>9.2f} {r['memory_error']:>+6.1%}")
        worst_t = max(abs(r["time_error"]) for r in rows)
        worst_m = max(abs(r["memory_error"]) for r in rows)
        fastest = min(rows, key=lambda r: r["measured_s"])
        pick = min(rows, key=lambda r: r["predicted_s"])
        in_t = sum(abs(r["time_error"]) <= 0.25 for r in rows)
        in_m = sum(abs(r["memory_error"]) <= 0.10 for r in rows)
        print(f"# world {world}: {len(rows)} layouts; step time within 25% in {in_t}, memory within 10% in {in_m}; "
              f"worst step-time error {worst_t:.1%}, worst memory error {worst_m:.1%}; planner's pick tp {pick['tp']} pp {pick['pp']} dp {pick['dp']} ZeRO {pick['zero']} "
              f"m {pick['microbatches']}: measured {pick['measured_s'] * 1e3:.1f} ms, "
              f"{pick['measured_s'] / fastest['measured_s']:.3f}x the fastest measured (tp {fastest['tp']} pp "
              f"{fastest['pp']} dp {fastest['dp']} ZeRO {fastest['zero']} m {fastest['microbatches']}, "
              f"{fastest['measured_s'] * 1e3:.1f} ms)")
        every += rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
