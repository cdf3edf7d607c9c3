"""Launch by launch: a 2-rank all_gather loop, builds (or settings) in turn.

Some placements of a VM's two cores make moving cache lines between them 3-5x
slower, for a whole launch (docs/performance.md, "Slot stores"); so the samples
here are launches. Each launch starts 2 ranks (spawned here, not pinned), runs
PHASES phases of all_gather at 64 KiB, 2 MiB and 16 MiB (200, 200 and 40
calls, after 10 warm-up calls), checks the result, and prints rank 0's mean
time per call of each phase. Builds take turns: NAME=PYTHONPATH[:VAR=VALUE].

    python benchmarks/launch_modes.py --launches 6 --build before=/path/to/old/python --build after=python
    python benchmarks/launch_modes.py --launches 6 --build cached=python:RINGCOMM_SLOT_STORES=cached \\
        --build auto=python
"""
import argparse
import os
import socket
import subprocess
import sys

RANK = r"""
import os, sys, time
import numpy as np
import ringcomm
comm = ringcomm.init()
r = comm.rank
phases = []
for _ in range(int(sys.argv[1])):
    row = []
    for n in (8192, 262144, 2097152):
        out = np.empty(2 * n, np.float32)
        inp = np.full(n, r + 1, np.float32)
        for _ in range(10):
            comm.all_gather(out, inp)
        iters = 200 if n < 1 << 20 else 40
        t = time.perf_counter()
        for _ in range(iters):
            comm.all_gather(out, inp)
        row.append((time.perf_counter() - t) / iters * 1e6)
        if not ((out[:n] == 1).all() and (out[n:] == 2).all()):
            raise SystemExit("wrong all_gather result")
    phases.append(row)
if r == 0:
    print(" | ".join("/".join(f"{v:.1f}" for v in row) for row in phases), flush=True)
comm.close()
"""


def parse_build(text):
    name, _, rest = text.partition("=")
    path, _, var = rest.partition(":")
    env = {}
    if var:
        k, _, v = var.partition("=")
        env[k] = v
    return name, os.path.abspath(path), env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(path, env_extra, phases):
    port = free_port()
    procs = []
    try:
        for r in (0, 1):
            env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
            env.update(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONPATH=path, **env_extra)
            procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(phases)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise SystemExit(f"a rank failed (exit {p.returncode}): {err.strip()[-2000:]}")
    return outs[0][0].strip()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=6)
    p.add_argument("--phases", type=int, default=3)
    p.add_argument("--build", action="append", type=parse_build, required=True)
    a = p.parse_args(argv)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"# {cpu}, {os.cpu_count()} CPUs; 2 ranks, all_gather 64 KiB / 2 MiB / 16 MiB, us per call (rank 0's "
          f"mean), {a.phases} phases per launch, builds in turn")
    print(f"# command: python benchmarks/launch_modes.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    for i in range(a.launches):
        for name, path, env in a.build:
            print(f"launch {i + 1} {name:>8}: {launch(path, env, a.phases)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
