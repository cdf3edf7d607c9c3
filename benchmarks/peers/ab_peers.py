"""Same-run A/B of ringcomm builds next to the MPI peers.

Each build is a PYTHONPATH that holds its own ringcomm (an installed copy, or
the checkout's python/), optionally with settings (NAME=PATH[:VAR=VALUE...]).
Launch i runs, for every build in turn and every MPI, one ringcomm-bench job
under that MPI's own launcher (benchmarks/peers/run_mpi.sh: ringcomm and the
MPI taking turns size by size in the job), so drift of a shared machine hits
every build alike. The summary gives, per op and size, each build's
ringcomm time (median over its jobs), its ratio to the best MPI (ringcomm's
time over the MPI's in the same job, median over jobs: <= 1.00 is at least
as fast) and its time over the first build's.

    python benchmarks/peers/ab_peers.py --peers /work/peers --mpi openmpi,mpich --np 4 --launches 3 \\
        --build before=/path/to/old --build after=python --out benchmarks/results/X \\
        -- --ops broadcast,reduce -b 4 -e 64K -f 4

JSON reports go to OUT/<build>-<mpi>-<launch>.json; the summary to OUT.txt.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

from ringcomm.bench.report import _cpu_model as cpu_model

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_build(text):
    """NAME=PATH[:VAR=VALUE...] -> (name, path, {VAR: VALUE})."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"--build wants NAME=PATH[:VAR=VALUE...], got {text!r}")
    path, *settings = rest.split(":")
    env = {}
    for s in settings:
        var, sep, value = s.partition("=")
        if not sep or not var:
            raise argparse.ArgumentTypeError(f"--build {text!r}: {s!r} is not VAR=VALUE")
        env[var] = value
    return name, os.path.abspath(path), env



def run_jobs(a, bench_args):
    os.makedirs(a.out, exist_ok=True)
    done = []
    for i in range(1, a.launches + 1):
        for name, path, env in a.build:
            for mpi in a.mpi:
                out = os.path.join(a.out, f"{name}-{mpi}-{i}.json")
                job_env = dict(os.environ, PYTHONPATH=path, **env)
                cmd = ["bash", os.path.join(HERE, "run_mpi.sh"), os.path.join(a.peers, mpi), str(a.np),
                       "--backends", "ringcomm,mpi", *bench_args, "--json", out]
                t0 = time.monotonic()
                r = subprocess.run(cmd, env=job_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   timeout=a.job_timeout)
                print(f"launch {i} {name} {mpi}: rc {r.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
                if r.returncode:
                    sys.stderr.write(r.stderr[-2000:])
                    continue
                done.append((name, out))
    return done


def summarize(builds, reports, note):
    """builds: names in order; reports: [(build, path)]."""
    # (op, world, dtype, size) -> build -> [(ringcomm us, mpi us, mpi name)]
    cells = collections.defaultdict(lambda: collections.defaultdict(list))
    head = []
    for build, path in reports:
        with open(path) as f:
            rep = json.load(f)
        lib = rep["machine"].get("mpi_library") or "mpi"
        mpi = next((s for k, s in (("Open MPI", "openmpi"), ("MPICH", "mpich"), ("Intel", "intelmpi")) if k in lib), lib)
        world = rep["config"]["world_size"]
        if not head:
            head.append(f"# {rep['date']}, {rep['machine'].get('cpu_model')}, world {world}, {rep['config']['dtype']}")
        for row in rep["results"]:
            ring, peer = row["backends"].get("ringcomm", {}), row["backends"].get("mpi", {})
            if "time_us" not in ring or ring.get("wrong") or "time_us" not in peer or peer.get("wrong"):
                continue
            cells[(row["op"], world, row["type"], row["size_bytes"])][build].append(
                (ring["time_us"], peer["time_us"], mpi))
    lines = head + [f"# {note}",
                    "# per build: ringcomm us (median over its jobs), ratio to the best MPI (same-job ratio, median "
                    "over that MPI's jobs), and its time / the first build's"]
    group = None
    for key in sorted(cells):
        if key[:3] != group:
            group = key[:3]
            lines.append(f"\n## {group[0]}, world {group[1]}, {group[2]}")
            cols = "".join(f"{b + ' us':>14}{'vs MPI':>8}" + (f"{'/' + builds[0]:>12}" if j else "")
                           for j, b in enumerate(builds))
            lines.append(f"{'size':>8}{cols}{'best MPI us':>13}")
        d = cells[key]
        first = statistics.median(t for t, _, _ in d[builds[0]]) if d.get(builds[0]) else None
        line = f"{key[3]:>8}"
        best_mpi = None
        for j, b in enumerate(builds):
            v = d.get(b)
            if not v:
                line += f"{'-':>14}{'-':>8}" + (f"{'-':>12}" if j else "")
                continue
            med = statistics.median(t for t, _, _ in v)
            by_mpi = collections.defaultdict(list)
            for t, m, name in v:
                by_mpi[name].append((t, m))
            best = min(by_mpi, key=lambda n: statistics.median(m for _, m in by_mpi[n]))
            best_us = statistics.median(m for _, m in by_mpi[best])
            best_mpi = best_mpi if best_mpi and best_mpi[1] <= best_us else (best, best_us)
            ratio = statistics.median(t / m for t, m in by_mpi[best])
            line += f"{med:14.2f}{ratio:8.2f}" + (f"{med / first:12.2f}" if j and first else "")
        line += f"{best_mpi[1]:9.2f} {best_mpi[0]}" if best_mpi else ""
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peers", required=True, help="the prefix of benchmarks/peers/install.sh")
    p.add_argument("--mpi", default="openmpi", help="comma-separated: openmpi, mpich, impi")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--build", type=parse_build, action="append", required=True)
    p.add_argument("--out", required=True, help="directory of the JSON reports; the summary is OUT.txt")
    p.add_argument("--job-timeout", type=float, default=900.0)
    p.add_argument("--summarize-only", action="store_true", help="summarize the reports already in OUT")
    a, rest = p.parse_known_args(argv)
    bench_args = rest[1:] if rest[:1] == ["--"] else rest
    a.mpi = [m for m in a.mpi.split(",") if m]
    names = [b[0] for b in a.build]
    if len(set(names)) != len(names):
        p.error("build names must differ")
    if a.summarize_only:
        reports = [(n, os.path.join(a.out, f)) for f in sorted(os.listdir(a.out)) for n in names
                   if f.startswith(n + "-") and f.endswith(".json")]
    else:
        reports = run_jobs(a, bench_args)
    note = (f"{cpu_model()}, {os.cpu_count()} CPUs; {a.launches} launches, builds in turn ("
            + ", ".join(f"{n}={path}{''.join(':' + k + '=' + v for k, v in env.items())}" for n, path, env in a.build)
            + f"), MPIs {', '.join(a.mpi)}; command: python benchmarks/peers/ab_peers.py "
            + " ".join(sys.argv[1:] if argv is None else argv))
    text = summarize(names, reports, note)
    with open(a.out.rstrip("/") + ".txt", "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
