"""`auto` against the best forced algorithm while load comes and goes (issue 24 item 5).

    python benchmarks/auto_under_load.py [--world 8] [--transport tcp] [--sizes 8,65536,4194304]
        [--scenarios idle,busy,comes,goes] [--out benchmarks/results/auto_under_load]

Every rank makes one communicator per backend, all over the same transport: `auto`
(the default: the cost model measured at init, checked by the tuner, comm/autotune.h),
`model` (auto with RINGCOMM_AUTOTUNE=0: the model's pick alone) and each forced
all_reduce algorithm. `auto` is made first, so its links are measured under the
scenario's load at init. A scenario is two phases; the load (two busy-looping
processes, as much as the 2 cores of this machine kind) is on or off in each:

    idle   off, off        busy   on, on
    comes  off, then on    goes   on, then off

In each phase and size, `auto` first runs alone for --settle seconds (its tuner
reacts to the change), then the backends take turns, --rounds rounds: each a
barrier of that communicator and back-to-back calls for >= --batch-ms. A round's time
per call is the slowest rank's; each cell is the median over rounds. The table gives
auto's and the model's ratio to the best forced algorithm of the same phase, and
what each ran (comm.tuning()).
"""

import argparse
import datetime
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

from ringcomm.bench.report import _cpu_model as cpu_model

ALGOS = ("oneshot", "recursive_doubling", "rabenseifner", "ring")
SCENARIOS = {"idle": (False, False), "busy": (True, True), "comes": (False, True), "goes": (True, False)}



def rank_main(rank, world, port, args, q):
    import numpy as np
    import torch.distributed as dist

    import ringcomm

    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=datetime.timedelta(seconds=600))
    names = ["auto", "model"] + list(ALGOS)
    comms = {}
    for name in names:
        os.environ["RINGCOMM_AUTOTUNE"] = "0" if name == "model" else "1"
        comms[name] = ringcomm.init(rank=rank, world_size=world, store=dist.PrefixStore(f"c/{name}", store),
                                    timeout=300, algo="auto" if name in ("auto", "model") else f"all_reduce:{name}",
                                    transport=args.transport)
    # The ranks agree when to stop a batch (a rank's own clock would give the
    # ranks different call counts): a MIN over this forced, untuned communicator.
    os.environ["RINGCOMM_AUTOTUNE"] = "0"
    ctl = ringcomm.init(rank=rank, world_size=world, store=dist.PrefixStore("c/ctl", store), timeout=300,
                        algo="recursive_doubling", transport=args.transport)
    flag = np.zeros(1, np.int32)
    bufs = {nb: np.ones(max(1, nb // 4), np.float32) for nb in args.sizes}
    out = {"times": {}, "tuning": {}}
    batch = args.batch_ms / 1e3

    def run(comm, x, seconds, at_least):
        n, spent, chunk = 0, 0.0, 1
        while True:
            t0 = time.perf_counter()
            for _ in range(chunk):
                x.fill(1.0)  # (keeps the values finite; the same work for every backend)
                comm.all_reduce(x)
            spent += time.perf_counter() - t0
            n += chunk
            flag[0] = 1 if n >= at_least and spent >= seconds else 0
            ctl.all_reduce(flag, op=ringcomm.ReduceOp.MIN)
            if flag[0]:
                return spent / n
            chunk = min(chunk * 2, 64)

    for phase in range(2):
        store.wait([f"phase{phase}"])
        for nb in args.sizes:
            x = bufs[nb]
            comms["auto"].barrier()
            run(comms["auto"], x, args.settle, 3)
            for rnd in range(args.rounds):
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for name in order:
                    c = comms[name]
                    if name not in ("auto", "model") and name == "oneshot" and nb > (1 << 20):
                        continue  # one-shot's scratch is world x size: not a candidate at this size
                    c.barrier()
                    out["times"].setdefault(f"{phase}/{nb}/{name}", []).append(run(c, x, batch, 3))
            for name in ("auto", "model"):
                t = [e for e in comms[name].tuning() if e["nbytes"] == nb]
                out["tuning"][f"{phase}/{nb}/{name}"] = {
                    "runs": comms[name].explain("all_reduce", nb)[0][0],
                    "state": t[0]["state"] if t else "-", "explorations": t[0]["explorations"] if t else 0}
        store.set(f"done{phase}/{rank}", "1")
    for c in list(comms.values()) + [ctl]:
        c.close()
    q.put((rank, out))


def hogs(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_scenario(name, args):
    import torch.distributed as dist

    load = SCENARIOS[name]
    port = 29500 + os.getpid() % 1000 + list(SCENARIOS).index(name) * 7
    running = hogs(args.hogs) if load[0] else []
    if running:
        time.sleep(0.5)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args.world, port, args, q)) for r in range(args.world)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    store = dist.TCPStore("127.0.0.1", port, args.world, is_master=False, timeout=datetime.timedelta(seconds=600))
    results = {}
    try:
        for phase in range(2):
            on = load[phase]
            if on and not running:
                running = hogs(args.hogs)
                time.sleep(0.5)
            if not on and running:
                for h in running:
                    h.kill()
                    h.wait()
                running = []
                time.sleep(0.5)
            store.set(f"phase{phase}", "1")
            store.wait([f"done{phase}/{r}" for r in range(args.world)], datetime.timedelta(seconds=args.limit))
        for _ in range(args.world):
            r, out = q.get(timeout=args.limit)
            results[r] = out
    finally:
        for h in running:
            h.kill()
            h.wait()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return results


def summarize(name, results, args, lines, doc):
    load = SCENARIOS[name]
    for phase in range(2):
        for nb in args.sizes:
            cell = {}
            for backend in ["auto", "model"] + list(ALGOS):
                key = f"{phase}/{nb}/{backend}"
                per_rank = [results[r]["times"].get(key) for r in results]
                if not per_rank[0]:
                    continue
                rounds = [max(ts[i] for ts in per_rank) for i in range(len(per_rank[0]))]
                cell[backend] = statistics.median(rounds) * 1e6
            forced = {a: cell[a] for a in ALGOS if a in cell}
            best = min(forced, key=forced.get)
            tun = results[0]["tuning"]
            row = {"scenario": name, "phase": phase, "load": "on" if load[phase] else "off", "bytes": nb,
                   "us": cell, "best_forced": best, "auto_ratio": cell["auto"] / forced[best],
                   "model_ratio": cell["model"] / forced[best],
                   "auto_runs": tun[f"{phase}/{nb}/auto"], "model_runs": tun[f"{phase}/{nb}/model"]["runs"]}
            doc["rows"].append(row)
            lines.append(f"{name:6} {phase} {row['load']:>4} {nb:>9}  best {best:>18} {forced[best]:9.1f}  "
                         f"auto {row['auto_runs']['runs']:>18} {cell['auto']:9.1f} {row['auto_ratio']:5.2f}x "
                         f"({row['auto_runs']['state']}, {row['auto_runs']['explorations']} expl.)  "
                         f"model {row['model_runs']:>18} {cell['model']:9.1f} {row['model_ratio']:5.2f}x  | "
                         + " ".join(f"{a} {forced[a]:.1f}" for a in ALGOS if a in forced))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--sizes", default="8,65536,4194304")
    ap.add_argument("--scenarios", default="idle,busy,comes,goes")
    ap.add_argument("--hogs", type=int, default=2, help="busy-looping processes while the load is on")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds auto runs alone before each size's turns")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-ms", type=float, default=30.0)
    ap.add_argument("--limit", type=float, default=900.0, help="seconds a phase may take")
    ap.add_argument("--out", default=None, help="PATH: writes PATH.txt and PATH.json")
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    head = [f"# python benchmarks/auto_under_load.py {' '.join(sys.argv[1:])}",
            f"# {datetime.date.today()}  host: {cpu_model()}, {os.cpu_count()} cores; world {args.world} over "
            f"{args.transport}; load: {args.hogs} busy loops",
            "# scenario phase load bytes | best forced algorithm (us per call) | auto: what it ran, us, ratio to "
            "best (tuner state) | model (RINGCOMM_AUTOTUNE=0) | every forced algorithm"]
    lines = list(head)
    doc = {"argv": sys.argv[1:], "cpu": cpu_model(), "rows": []}
    for name in args.scenarios.split(","):
        t0 = time.time()
        res = run_scenario(name, args)
        summarize(name, res, args, lines, doc)
        print("\n".join(lines[-2 * len(args.sizes):]), f"  ({time.time() - t0:.0f} s)", flush=True)
    ok = [r for r in doc["rows"] if r["auto_ratio"] <= 1.3]
    lines.append(f"# auto within 1.3x of the best forced: {len(ok)} of {len(doc['rows'])}; worst "
                 f"{max(r['auto_ratio'] for r in doc['rows']):.2f}x; the model alone worst "
                 f"{max(r['model_ratio'] for r in doc['rows']):.2f}x")
    print(lines[-1])
    if args.out:
        with open(args.out + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(args.out + ".json", "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
