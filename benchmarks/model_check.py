"""How well ringcomm's cost model predicts, and how well `auto` picks, from the JSON
of benchmarks/multihost.py runs made with `-- --explain` (and `auto` first in
--algos, so the explained communicator is auto's).

    python benchmarks/model_check.py /tmp/mh_8x1.json [/tmp/mh_4x2.json ...] --out results/model_check

For every configuration, size and forced algorithm: the measured time (each
repeat), the model's prediction (from auto's communicator: its parameters were
measured at its init), and the error; then auto's pick and time against the best
forced algorithm measured in the same run, and gloo. A row's "pick ok" means
auto's measured time is within 10% of the best measured one.
"""

import argparse
import json
import math
import statistics
import sys


def algo_of(backend):
    """'ringcomm[all_reduce:rabenseifner]' -> 'rabenseifner'; 'ringcomm[auto]' -> 'auto'."""
    if not backend.startswith("ringcomm["):
        return None
    spec = backend[len("ringcomm["):-1]
    if spec.startswith("ringcomm:"):
        spec = spec[len("ringcomm:"):]
    names = [part.split(":")[-1] for part in spec.split(",")]
    return names[0] if len(set(names)) == 1 else spec


def collect(paths):
    """{(config, op, size): {"measured": {algo: [us...]}, "predicted": {algo: us}, "pick": name}}"""
    out = {}
    for spec in paths:
        path, _, label = spec.partition("=")
        with open(path) as f:
            doc = json.load(f)
        extra = f" {label}" if label else ""
        for run in doc["runs"]:
            rep = run.get("report")
            if not rep:
                continue
            config = (f"{run['hosts']}x{run['ranks_per_host']} {run['placement']}"
                      f"{' ' + doc['rate'] if doc.get('rate') else ' veth'}{extra}")
            for row in rep["results"]:
                key = (config, row["op"], row["size_bytes"])
                entry = out.setdefault(key, {"measured": {}, "predicted": {}, "pick": None})
                if row.get("explain"):
                    ex = row["explain"]
                    entry["pick"] = ex[0][0]
                    for name, secs in ex:
                        if secs is not None:
                            entry["predicted"][name] = secs * 1e6
                for backend, cell in row["backends"].items():
                    t = cell.get("time_us")
                    if t is None:
                        continue
                    name = ("gloo" if backend == "gloo" else
                            entry["pick"] if backend == "ringcomm" else algo_of(backend))  # one --algo: its own name
                    if name:
                        entry["measured"].setdefault(name, []).append(t)
    return out


def fmt(us):
    return "-" if us is None else (f"{us:9.0f}" if us >= 1000 else f"{us:9.1f}")


def report(data, out):
    errors, picks = [], []
    lines = []
    w = lines.append
    for (config, op, size) in sorted(data, key=lambda k: (k[0], k[1], k[2])):
        e = data[(config, op, size)]
        meas = {a: statistics.median(ts) for a, ts in e["measured"].items()}
        forced = {a: t for a, t in meas.items() if a not in ("auto", "gloo")}
        if not forced:
            continue
        best = min(forced, key=forced.get)
        auto = meas.get("auto")
        pick_ok = auto is not None and auto <= 1.10 * forced[best]
        if auto is not None:
            picks.append(pick_ok)
        cells = []
        for a in sorted(forced):
            p = e["predicted"].get(a)
            err = None if p is None else (p - forced[a]) / forced[a] * 100
            if err is not None:
                errors.append(abs(err))
            cells.append(f"{a} {fmt(forced[a]).strip()}/{fmt(p).strip()}"
                         f"{'' if err is None else f' ({err:+.0f}%)'}")
        pa = e["predicted"].get(e["pick"]) if e["pick"] else None
        w(f"{config:<28} {op:<11} {size:>9}  auto={e['pick'] or '?':<18} {fmt(auto)}/{fmt(pa).strip():<8} "
          f"best={best:<18} {fmt(forced[best])}  {('ok ' if pick_ok else 'NO ') if auto is not None else '-  '}  "
          f"gloo {fmt(meas.get('gloo'))}  | " + "; ".join(cells))
    within = sum(1 for x in errors if x <= 25)
    summary = [
        f"# predictions within 25% of the measured time: {within} of {len(errors)}"
        f" (median |error| {statistics.median(errors):.0f}%, worst {max(errors):.0f}%)" if errors else "# no predictions",
        f"# auto within 10% of the best measured algorithm: {sum(picks)} of {len(picks)} sizes",
    ]
    head = ["# config, op, size (B); auto's pick (model), its measured/predicted time (us); the best forced algorithm",
            "# measured; pick ok (auto <= 1.10 x best); gloo (us); per algorithm measured/predicted us (error)"]
    text = "\n".join(head + summary + lines + summary) + "\n"
    out.write(text)
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="multihost.py --out X: X.json files (X.json=LABEL adds LABEL to "
                                           "its configurations, e.g. for a run with RINGCOMM_RING_ORDER=rank)")
    ap.add_argument("--out", help="also write the table to OUT.txt")
    args = ap.parse_args(argv)
    text = report(collect(args.json), sys.stdout)
    if args.out:
        with open(args.out + ".txt", "w") as f:
            f.write(f"# python {' '.join(['benchmarks/model_check.py', *sys.argv[1:]])}\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
