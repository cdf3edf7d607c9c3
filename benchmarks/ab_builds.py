"""Same-run A/B of two ringcomm builds on the hot paths.

Each build is a Python interpreter that imports its own ringcomm (a venv, or
PYTHONPATH pointing at an installed copy). The builds take turns launch by
launch (A, B, A, B, ...), so drift of a shared machine hits both alike; every
launch is `ringcomm-bench` (python -m ringcomm.bench.cli) over the same
sizes, 2 ranks on shared memory, and the figure of a launch is its own
median. Reported per metric: the median over launches of each build, the
range, and after/before (time: below 1 is faster; busbw: above 1 is faster).
Launches on these 2-core machines are bimodal (a launch whose ranks share a
core for a while is 10x slower at small sizes, for either build), so each
metric also gets the first quartile over launches (the fast mode's level,
which a few slow launches do not move) with its ratio, and the number of
slow launches (3x the fastest launch of either build, or worse) per build,
and the ratio of the two builds' medians over their launches outside that slow
mode (the fast-mode ratio).

    python benchmarks/ab_builds.py --before /path/to/old/python --after .venv/bin/python \\
        --launches 6 --out benchmarks/results/ab_builds.txt [--runs small,p2p,large]

Metrics: all_reduce 4 B and 1 KiB, broadcast 8 B, send/recv 8 B (time per
call, nccl-tests' batched timing), all_reduce 64 MiB busbw and the same run's
memcpy bandwidth.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# (key for --runs, name, bench arguments)
RUNS = [
    ("small", "small all_reduce", ["--ops", "all_reduce", "-b", "4", "-e", "1K", "-f", "256", "--no-memcpy"]),
    ("p2p", "broadcast, send/recv", ["--ops", "broadcast,sendrecv", "-b", "8", "-e", "8", "--no-memcpy"]),
    ("large", "large all_reduce", ["--ops", "all_reduce", "-b", "64M", "-e", "64M"]),
]
METRICS = [
    ("all_reduce 4 B (us)", "all_reduce", 4, "time_us"),
    ("all_reduce 1 KiB (us)", "all_reduce", 1024, "time_us"),
    ("broadcast 8 B (us)", "broadcast", 8, "time_us"),
    ("send/recv 8 B (us)", "sendrecv", 8, "time_us"),
    ("all_reduce 64 MiB busbw (GB/s)", "all_reduce", 64 << 20, "busbw_gbps"),
    ("memcpy 64 MiB (GB/s)", "all_reduce", 64 << 20, "memcpy"),
]


def launch(python, args, timeout):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [python, "-m", "ringcomm.bench.cli", "--backends", "ringcomm", "--progress", "off", "--json", out, *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        with open(out) as f:
            return json.load(f)


def read(doc, op, size, what):
    for row in doc["results"]:
        if row["op"] == op and row["size_bytes"] == size:
            if what == "memcpy":
                m = row.get("memcpy")
                return None if m is None else m.get("bandwidth_gbps", m.get("gbps"))
            b = row["backends"].get("ringcomm")
            if b and b.get("wrong"):
                raise SystemExit(f"{op} {size} B: {b['wrong']} wrong elements")
            return b and b[what]
    return None


def quartile(xs, q):
    """The q-quantile of xs (linear between order statistics)."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="python of the build before")
    p.add_argument("--after", required=True, help="python of the build after")
    p.add_argument("--launches", type=int, default=6, help="launches of each build (default 6)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one launch may take")
    p.add_argument("--runs", default="small,p2p,large",
                   help="which runs: small (all_reduce 4 B..1 KiB), p2p (broadcast, send/recv), large "
                        "(all_reduce 64 MiB and memcpy); default all")
    p.add_argument("--out", help="also write the report here")
    p.add_argument("--raw", help="write every launch's figures here (JSON)")
    a = p.parse_args(argv)
    builds = {"before": a.before, "after": a.after}
    got = {b: {m[0]: [] for m in METRICS} for b in builds}
    cpu = None
    wanted = set(a.runs.split(","))
    unknown = wanted - {key for key, _, _ in RUNS}
    if unknown:
        p.error(f"--runs: unknown {sorted(unknown)}")
    runs = [(name, args) for key, name, args in RUNS if key in wanted]
    for i in range(a.launches):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for _, args in runs:
            for b in order:
                doc = launch(builds[b], args, a.timeout)
                cpu = cpu or doc["machine"].get("cpu_model")
                for name, op, size, what in METRICS:
                    v = read(doc, op, size, what)
                    if v is not None:
                        got[b][name].append(v)
        print(f"launch {i + 1}/{a.launches} done", file=sys.stderr)
    lines = [f"# ab_builds: {a.launches} launches of each build, alternating; 2 ranks, shared memory; "
             f"CPU: {cpu}, {os.cpu_count()} cores",
             f"# before: {a.before}", f"# after:  {a.after}",
             f"{'metric':34} {'before median (min..max)':>28} {'after median (min..max)':>28} {'after/before':>13}"
             f" {'q1 before':>10} {'q1 after':>9} {'q1 ratio':>9} {'slow b/a':>9} {'fast-mode ratio':>16}"]
    for name, *_ in METRICS:
        xb, xa = got["before"][name], got["after"][name]
        if not xb or not xa:
            lines.append(f"{name:34} {'(not measured)':>28}")
            continue
        time_like = "(us)" in name
        mb, ma = statistics.median(xb), statistics.median(xa)
        # q1 of times (the fast quarter's edge); of bandwidths, the third quartile.
        qb, qa = (quartile(x, 0.25 if time_like else 0.75) for x in (xb, xa))
        best = min(xb + xa) if time_like else max(xb + xa)
        slow = [sum(1 for v in x if (v > 3 * best if time_like else v < best / 3)) for x in (xb, xa)]
        # The median of each build's launches outside the slow mode.
        fast = [[v for v in x if not (v > 3 * best if time_like else v < best / 3)] for x in (xb, xa)]
        fr = statistics.median(fast[1]) / statistics.median(fast[0]) if all(fast) else float("nan")
        lines.append(f"{name:34} {mb:>10.3f} ({min(xb):.3f}..{max(xb):.3f}) {ma:>10.3f} ({min(xa):.3f}..{max(xa):.3f})"
                     f" {ma / mb:>12.3f} {qb:>10.3f} {qa:>9.3f} {qa / qb:>9.3f} {slow[0]:>4}/{slow[1]:<4}"
                     f" {fr:>16.3f}")
    if a.raw:
        with open(a.raw, "w") as f:
            json.dump({"cpu": cpu, "launches": got}, f, indent=1)
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
