"""A long run's steady state: what `auto` settles to over many calls, per launch.

ringcomm-bench samples a size a few times right after warming it up; a
training job repeats one call for hours. This runs ITERS calls of one op and
size on 2 ranks pinned to cores 0 and 1 (taskset), in fresh launches that
alternate between settings (e.g. RINGCOMM_PULL=0 against the default), and
reports per launch the median time of the last half of the calls and what the
tuner runs by then. The VM's cores land in placements that change the FIFO's
speed for a whole launch, so the launches are the samples.

    python benchmarks/steady_state.py --launches 6 --op all_reduce --mb 128 \\
        --setting nopull=RINGCOMM_PULL=0 --setting default= > benchmarks/results/X.txt

(--kb N for sizes under a MiB.)
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

RANK = r"""
import json, os, sys, time
import numpy as np
import ringcomm
comm = ringcomm.init()
op, n, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = np.ones(n // 4, np.float32)
part = np.ones(n // 4 // comm.world_size, np.float32)
times = []
for _ in range(iters):
    comm.barrier()
    t = time.perf_counter()
    if op == "all_reduce":
        comm.all_reduce(x)
    elif op == "all_gather":
        comm.all_gather(x, part)
    elif op == "broadcast":
        comm.broadcast(x, src=0)
    elif op == "reduce_scatter":
        comm.reduce_scatter(part, x)
    elif op == "reduce":
        comm.reduce(x, dst=0)
    times.append(time.perf_counter() - t)
runs = [e["runs"] for e in comm.tuning() if e["op"] == op]
if comm.rank == 0:
    print(json.dumps({"times": times, "runs": runs[0] if runs else "-"}))
comm.close()
"""


def launch(op, nbytes, iters, env_extra, port):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(RANK)
        script = f.name
    procs = []
    try:
        for r in (0, 1):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1", **env_extra)
            procs.append(subprocess.Popen(["taskset", "-c", str(r), sys.executable, script, op, str(nbytes),
                                           str(iters)], env=env, stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        os.unlink(script)
    import json
    return json.loads(outs[0].strip().splitlines()[-1])


def parse_setting(text):
    name, _, rest = text.partition("=")
    env = {}
    if rest:
        k, _, v = rest.partition("=")
        env[k] = v
    return name, env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="all_reduce", choices=("all_reduce", "all_gather", "broadcast", "reduce_scatter",
                                                            "reduce"))
    p.add_argument("--mb", type=int, default=128)
    p.add_argument("--kb", type=int, help="the size in KiB instead of --mb")
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--launches", type=int, default=4)
    p.add_argument("--setting", action="append", type=parse_setting, required=True,
                   help="NAME=VAR=VALUE (or NAME= for none); the settings take turns launch by launch")
    a = p.parse_args(argv)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    nbytes = a.kb << 10 if a.kb else a.mb << 20
    size = f"{a.kb} KiB" if a.kb else f"{a.mb} MiB"
    print(f"# {cpu}, {os.cpu_count()} CPUs; {a.op} {size}, 2 ranks pinned to cores 0 and 1, {a.iters} calls "
          f"per launch, {a.launches} launches per setting, settings in turn")
    print(f"# command: python benchmarks/steady_state.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"# per launch: median ms of the last {a.iters // 2} calls, and what the tuner runs at the end")
    got = {name: [] for name, _ in a.setting}
    port = 31000 + os.getpid() % 1000
    for i in range(a.launches):
        for name, env in a.setting:
            port += 1
            res = launch(a.op, nbytes, a.iters, env, port)
            med = statistics.median(res["times"][a.iters // 2:]) * 1e3
            got[name].append(med)
            print(f"launch {i + 1} {name:>10}: {med:8.{2 if nbytes >= 1 << 20 else 4}f} ms  runs {res['runs']}",
                  flush=True)
    for name, meds in got.items():
        digits = 2 if nbytes >= 1 << 20 else 4
        print(f"# {name:>10}: median over launches {statistics.median(meds):8.{digits}f} ms; launches "
              + " ".join(f"{m:.{digits - 1}f}" for m in sorted(meds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
