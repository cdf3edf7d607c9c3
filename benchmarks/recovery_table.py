"""Recovery from a lost rank, seven ways, in one run: the time from the kill to
the next completed step, and the steps lost (issue 23).

    python benchmarks/recovery_table.py [--repeats 3]

The same job every time: 4 data-parallel workers (a small MLP, SGD with
momentum, a fixed global batch, 50 ms of other work per step, as in
examples/elastic_dp.py); worker 2 is SIGKILLed during step 7.

- ringcomm shrink: ElasticDataParallel; the survivors revoke, shrink and redo
  step 7 on 3 ranks (examples/elastic_dp.py --join-step -1).
- ringcomm grow: the same, and a replacement process is started at the kill;
  the members admit it at the first step boundary after it is up
  (--replace-at-kill): also the time until the world is 4 again.
- ringcomm ZeRO-3 shrink / grow: the same two on ElasticZeroDataParallel
  (ZeroDataParallel stage 3, --zero 3): the survivors rebuild the lost rank's
  shards from its successor's copy; a replacement gets its shards re-cut.
- torchft on ringcomm / on Gloo: 4 replica groups of one process each
  (benchmarks/torchft_replica.py) under a lighthouse in this process (1 s
  heartbeat timeout); replica 0's next committed step.
- torchrun restart: torchrun --max-restarts 1 restarts all 4 workers, which
  resume from the checkpoint of step 5 (benchmarks/torchrun_restart_worker.py).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KILL_STEP = 7
STEP_TIME = 0.05


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def _run(cmd, timeout=240):
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, out
    return proc.returncode, out


def elastic(tmp, grow, zero=0):
    report = os.path.join(tmp, "report.json")
    cmd = [sys.executable, os.path.join(ROOT, "examples", "elastic_dp.py"), "--kill-step", str(KILL_STEP),
           "--step-time", str(STEP_TIME), "--report", report, "--zero", str(zero)]
    cmd += ["--replace-at-kill", "--steps", "90"] if grow else ["--join-step", "-1", "--steps", "12"]
    rc, out = _run(cmd)
    if rc != 0:
        return {"error": out[-600:]}
    with open(report) as f:
        rep = json.load(f)
    killed = rep["killed_at"]
    steps = {int(s): v for s, v in rep["steps"].items()}
    after = min(s for s in steps if s >= KILL_STEP)
    res = {"next_s": steps[after][0] - killed, "lost": KILL_STEP - after}
    if grow:
        back = [v[0] for s, v in sorted(steps.items()) if s > KILL_STEP and v[1] == 4]
        res["world_back_s"] = back[0] - killed if back else None
    return res


def torchft(tmp, backend, replicas=4):
    os.environ.setdefault("RUST_LOG", "error")  # the lighthouse logs every quorum otherwise
    from torchft._torchft import LighthouseServer

    lh = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=3000, heartbeat_timeout_ms=1000)
    outs = [os.path.join(tmp, f"{backend}-{r}.json") for r in range(replicas)]
    procs = []
    try:
        for r in range(replicas):
            cmd = [sys.executable, os.path.join(HERE, "torchft_replica.py"), str(r), backend, lh.address(), "14",
                   str(KILL_STEP if r == 2 else -1), outs[r], "1", "-1", ",".join(outs), "", str(STEP_TIME)]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 240
        for p in procs:
            try:
                p.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    finally:
        lh.shutdown()
    if procs[0].returncode != 0 or not os.path.exists(outs[0]):
        return {"error": f"replica 0 exited with {procs[0].returncode}"}
    with open(outs[2] + ".killed") as f:
        killed = float(f.read())
    with open(outs[0]) as f:
        log = json.load(f)["log"]
    committed = [e for e in log if e["step"] >= KILL_STEP and e["committed"]]
    skipped = sum(1 for e in log if not e["committed"])
    return {"next_s": committed[0]["t"] - killed, "lost": skipped}


def torchrun_restart(tmp):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "4", "--max-restarts", "1",
           os.path.join(HERE, "torchrun_restart_worker.py"), "--dir", tmp, "--steps", "10", "--kill-step",
           str(KILL_STEP), "--step-time", str(STEP_TIME)]
    rc, out = _run(cmd)
    if rc != 0:
        return {"error": out[-600:]}
    with open(os.path.join(tmp, "killed_at")) as f:
        killed = float(f.read())
    with open(os.path.join(tmp, "log.txt")) as f:
        log = [line.split() for line in f]
    first = next((int(s), float(t)) for s, t, a, _ in log if a == "1")
    return {"next_s": first[1] - killed, "lost": KILL_STEP - first[0]}


METHODS = [
    ("ringcomm shrink", lambda tmp: elastic(tmp, grow=False)),
    ("ringcomm grow", lambda tmp: elastic(tmp, grow=True)),
    ("ringcomm ZeRO-3 shrink", lambda tmp: elastic(tmp, grow=False, zero=3)),
    ("ringcomm ZeRO-3 grow", lambda tmp: elastic(tmp, grow=True, zero=3)),
    ("torchft on ringcomm", lambda tmp: torchft(tmp, "ringcomm")),
    ("torchft on Gloo", lambda tmp: torchft(tmp, "gloo")),
    ("torchrun restart", torchrun_restart),
]


def main():
    from ringcomm.bench.report import _cpu_model as cpu_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", help="comma-separated method names (default: all)")
    args = ap.parse_args()
    chosen = [m for m in METHODS if not args.only or m[0] in args.only.split(",")]
    print(f"# CPU: {cpu_model()}, {os.cpu_count()} cores; 4 workers, worker 2 SIGKILLed in step {KILL_STEP}; "
          f"{args.repeats} run(s) of each, interleaved")
    results = {name: [] for name, _ in chosen}
    for rep in range(args.repeats):
        for name, fn in chosen:
            with tempfile.TemporaryDirectory(prefix="ringcomm_recovery_") as tmp:
                r = fn(tmp)
            results[name].append(r)
            shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "error"}
            print(f"#   run {rep + 1} {name}: {shown if 'error' not in r else 'FAILED: ' + r['error'][-200:]}",
                  flush=True)
    print()
    print("| method | kill -> next completed step (s), median [min, max] | steps lost | runs that recovered |")
    print("| --- | --- | --- | --- |")
    for name, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if ok:
            t = sorted(r["next_s"] for r in ok)
            lost = sorted({r["lost"] for r in ok})
            cell = f"{statistics.median(t):.2f} [{t[0]:.2f}, {t[-1]:.2f}]"
            back = [r["world_back_s"] for r in ok if r.get("world_back_s") is not None]
            if back:
                cell += f"; world 4 again after {statistics.median(back):.2f} s"
        else:
            cell, lost = "-", "-"
        print(f"| {name} | {cell} | {', '.join(map(str, lost)) if ok else '-'} | {len(ok)} of {len(runs)} |")


if __name__ == "__main__":
    main()
