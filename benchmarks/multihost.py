#!/usr/bin/env python3
"""Collectives across several "hosts" on one machine: ringcomm's algorithms next to
torch gloo, each host a network namespace, launched as on a real cluster.

    python benchmarks/multihost.py --hosts 2,4,8 --ranks-per-host 1,2 \\
        --placement contiguous,interleaved --algos ring,oneshot,all_reduce:rabenseifner,auto \\
        --ops all_reduce -b 8 -e 64M -f 8 --rate 1gbit --repeat 3 --out /tmp/mh_1gbit

For every (hosts H, ranks per host R, placement) it makes H namespaces joined by a
Linux bridge (ringcomm.bench.netns; optionally every link shaped with tbf, both
directions), and `--repeat` times runs, in each namespace i,

    ip netns exec <ns i> torchrun --nnodes H --node-rank i --nproc-per-node R \\
        --master-addr <host 0> --master-port P -m ringcomm.bench.cli \\
        --backends ringcomm,gloo --algo A1 --algo A2 ... --json <run>.json

so every algorithm (one ringcomm communicator each, RINGCOMM_ALGO set before its
init) and gloo take turns size by size in one run: drift and the bimodal runs of
this VM hit them alike. `--placement interleaved` renumbers ranks across hosts
(rank = local_rank * H + node_rank, benchmarks/interleaved_rank.py).

Each run must pass: every torchrun exits 0, the bench's own check finds no wrong
element, every (op, size, algorithm) is measured, and ringcomm grouped the ranks
into the hosts they run on. Writes OUT.txt (the table: one line per configuration,
op, size and algorithm, with each run's time and busbw) and OUT.json (every row of
every run, every run's bench report, the failures); the header carries the CPU
model and this exact command. Exits 1 if any run failed.

Every launch has a hard timeout (--launch-timeout); a hang kills every process in
the namespaces and fails the run. The namespaces are removed afterwards, also on
Ctrl-C, and stale ones of an earlier run that was killed are removed first. Needs
root and iproute2. Pass more bench flags after `--` (e.g. `-- -n 5 --budget 0.1`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import ringcomm.bench  # noqa: F401
except ImportError:  # not installed: the source tree next to this script
    sys.path.insert(0, os.path.join(HERE, "..", "python"))

from ringcomm.bench import netns  # noqa: E402
from ringcomm.bench.collectives import resolve_ops  # noqa: E402
from ringcomm.bench.report import _cpu_model, format_time, validate_report  # noqa: E402
from ringcomm.bench.sizes import format_size, parse_size  # noqa: E402

PREFIX = "rcmb"  # namespaces rcmb<pid>br, rcmb<pid>h<i>
SUBNET = "10.78.0"
PLACEMENTS = ("contiguous", "interleaved")
BASE_PORT = 29500
# Environment the launches must not inherit: each namespace sets its own.
_DROP_ENV = ("RINGCOMM_", "MASTER_", "TORCHELASTIC_", "GLOO_")
_DROP_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
_EXTRA_ENV: Dict[str, str] = {}  # --env


@dataclass(frozen=True)
class Config:
    hosts: int
    ranks_per_host: int
    placement: str

    @property
    def world(self) -> int:
        return self.hosts * self.ranks_per_host

    def host_of(self, rank: int) -> int:
        if self.placement == "interleaved":
            return rank % self.hosts
        return rank // self.ranks_per_host

    def label(self) -> str:
        return f"{self.hosts} hosts x {self.ranks_per_host} {self.placement}"


def expected_groups(cfg: Config) -> str:
    """The host grouping the bench reports for ringcomm (same_host_groups' format)."""
    groups = [[r for r in range(cfg.world) if cfg.host_of(r) == h] for h in range(cfg.hosts)]
    return " | ".join(",".join(map(str, g)) for g in sorted(groups))


def configs(hosts: List[int], per_host: List[int], placements: List[str]) -> List[Config]:
    """Every combination; with one rank per host (or one host) the placements coincide,
    so such a configuration runs once, as contiguous."""
    out: List[Config] = []
    for h in hosts:
        for r in per_host:
            for p in placements:
                cfg = Config(h, r, p if h > 1 and r > 1 else "contiguous")
                if cfg not in out:
                    out.append(cfg)
    return out


# --------------------------------------------------------------------------- arguments

def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give integers >= 1")
    return values


def _names(text: str, allowed=None) -> List[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if allowed is not None and v not in allowed]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: expected some of {', '.join(allowed or [])}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="multihost.py", description=__doc__.split("\n\n")[0],
        epilog="Flags after `--` go to ringcomm-bench unchanged.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--hosts", type=_int_list, default=[2], help="host counts, comma list (default 2)")
    a("--ranks-per-host", type=_int_list, default=[1], help="ranks per host, comma list (default 1)")
    a("--placement", type=lambda t: _names(t, PLACEMENTS), default=["contiguous"],
      help="contiguous (torchrun's numbering) and/or interleaved (rank = local_rank * hosts + "
           "node_rank), comma list (default contiguous)")
    a("--algos", default="ring;auto",
      help="ringcomm algorithms, each forced with RINGCOMM_ALGO: a list separated by spaces "
           "or ';' (commas belong to the per-op form, e.g. 'ring;oneshot;"
           "all_reduce:recursive_doubling;all_reduce:rabenseifner;auto'); '' for none "
           "(default %(default)s)")
    a("--no-gloo", action="store_true", help="leave torch gloo out")
    a("--ops", default="all_reduce", help="primitives, as ringcomm-bench --ops (default %(default)s)")
    a("-b", "--minbytes", default="8", help="smallest size (default %(default)s)")
    a("-e", "--maxbytes", default="64M", help="largest size (default %(default)s)")
    a("-f", "--stepfactor", type=int, default=8, help="size multiplier (default %(default)s)")
    a("--rate", default=None,
      help="shape every host's link with tbf to this tc rate (e.g. 1gbit, 10gbit), both "
           "directions; default: unshaped veth")
    a("--no-pin", dest="pin", action="store_false",
      help="let every host run on every CPU (default: the CPUs are dealt out to the hosts, "
           "so each sees the cores it has; see host_cpus)")
    a("--env", action="append", default=[], metavar="NAME=VALUE",
      help="set this variable on every host (the harness otherwise drops RINGCOMM_* from its own "
           "environment), e.g. --env RINGCOMM_RING_ORDER=rank; may be given several times")
    a("--calibrate", action="store_true",
      help="before the runs of each configuration, one launch of ringcomm-bench --calibrate on "
           "the same hosts writes OUT_<config>_model.json (links and the families' fit), and the "
           "runs use it (RINGCOMM_COST_MODEL): auto then picks with what was measured there")
    a("--calibrate-runs", type=int, default=3, metavar="N",
      help="--calibrate: ringcomm-bench --calibrate-runs (the link parameters' median over N runs; "
           "default %(default)s)")
    a("--calibrate-passes", type=int, default=3, metavar="N",
      help="--calibrate: ringcomm-bench --calibrate-passes (passes of the families' fit; default %(default)s)")
    a("--repeat", type=int, default=1, help="runs of each configuration (default 1)")
    a("--out", default="multihost", help="writes OUT.txt and OUT.json (default %(default)s)")
    a("--launch-timeout", type=float, default=900.0,
      help="seconds one run (all its hosts) may take before it is killed (default %(default)s)")
    a("--call-timeout", type=float, default=120.0,
      help="ringcomm-bench --timeout: seconds a rendezvous or call may block (default %(default)s)")
    return p


def parse_args(argv: List[str]):
    bench_extra: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, bench_extra = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.bench_extra = bench_extra
    for item in args.env:
        name, eq, _ = item.partition("=")
        if not eq or not name or not name.replace("_", "").isalnum():
            parser.error(f"--env {item!r}: expected NAME=VALUE")
    _EXTRA_ENV.clear()
    _EXTRA_ENV.update(item.split("=", 1) for item in args.env)
    args.algos = [a for a in args.algos.replace(";", " ").split() if a]
    if args.no_gloo and not args.algos:
        parser.error("nothing to run: no algorithm and --no-gloo")
    try:
        args.ops = resolve_ops(args.ops)
        lo, hi = parse_size(args.minbytes), parse_size(args.maxbytes)
        if args.rate is not None:
            netns.rate_bits(args.rate)
    except ValueError as e:
        parser.error(str(e))
    if lo > hi or args.stepfactor < 2:
        parser.error("need -b <= -e and -f >= 2")
    if args.repeat < 1 or args.launch_timeout <= 0 or args.call_timeout <= 0:
        parser.error("--repeat must be >= 1, the timeouts > 0")
    if max(args.hosts) > netns.MAX_HOSTS:
        parser.error(f"at most {netns.MAX_HOSTS} hosts")
    args.out = os.path.splitext(args.out)[0] if args.out.endswith((".txt", ".json")) else args.out
    return args


# --------------------------------------------------------------------------- one run

def bench_argv(args, json_path: str) -> List[str]:
    backends = (["ringcomm"] if args.algos else []) + ([] if args.no_gloo else ["gloo"])
    argv = ["--backends", ",".join(backends), "--ops", ",".join(args.ops),
            "-b", args.minbytes, "-e", args.maxbytes, "-f", str(args.stepfactor),
            "--timeout", f"{args.call_timeout:g}", "--no-memcpy", "--progress", "off",
            "--json", json_path]
    for algo in args.algos:
        argv += ["--algo", algo]
    return argv + args.bench_extra


def host_command(cfg: Config, host: netns.Host, master: str, port: int,
                 bench: List[str]) -> List[str]:
    program = [os.path.join(HERE, "interleaved_rank.py"), "-m", "ringcomm.bench.cli"] \
        if cfg.placement == "interleaved" else ["-m", "ringcomm.bench.cli"]
    return [*host.exec_prefix(), sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(cfg.hosts), "--node-rank", str(host.index),
            "--nproc-per-node", str(cfg.ranks_per_host), "--master-addr", master,
            "--master-port", str(port), "--max-restarts", "0", "--monitor-interval", "0.2",
            *program, *bench]


def host_cpus(index: int, hosts: int) -> List[int]:
    """The CPUs host `index` of `hosts` runs on: the machine's usable CPUs dealt out
    in turn, so that hosts share as little as they can (with more hosts than CPUs,
    some share one). A host then sees the cores it has (sched_getaffinity), as
    ringcomm's choice to spin or sleep while waiting assumes; unpinned, every host
    would believe it has all of them and spin against the others."""
    usable = sorted(os.sched_getaffinity(0))
    if hosts <= len(usable):
        return [c for k, c in enumerate(usable) if k % hosts == index]
    return [usable[index % len(usable)]]


def host_env(host: netns.Host) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_DROP_ENV) and k not in _DROP_VARS}
    env.update(RINGCOMM_HOST_ID=f"host{host.index}",  # namespaces share hostname and boot id
               RINGCOMM_SOCKET_IFNAME=host.ifname, GLOO_SOCKET_IFNAME=host.ifname,
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    env.update(_EXTRA_ENV)
    return env


def _tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return "(no log)"
    return text[-chars:]


def launch(cfg: Config, hosts: List[netns.Host], port: int, bench: List[str], workdir: str,
           timeout_s: float, pin: bool = True):
    """Runs one configuration once; returns (per host: its exit code, 'hung' or 'killed'
    (still running 10 s after another host failed), the log paths)."""
    procs, logs, paths = [], [], []
    try:
        for h in hosts:
            path = os.path.join(workdir, f"host{h.index}.log")
            paths.append(path)
            log = open(path, "w")
            logs.append(log)
            cpus = host_cpus(h.index, len(hosts)) if pin else None
            procs.append(subprocess.Popen(host_command(cfg, h, hosts[0].addr, port, bench),
                                          env=host_env(h), stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=(lambda c=cpus: os.sched_setaffinity(0, c))
                                          if cpus else None))
        deadline = time.monotonic() + timeout_s
        failed_at = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                return codes, paths
            now = time.monotonic()
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = now  # the others get a few seconds to fail on their own
            if now >= deadline or (failed_at is not None and now - failed_at > 10):
                _dump_stacks(hosts)
                left = "hung" if now >= deadline else "killed"  # after a peer had failed
                return [c if c is not None else left for c in codes], paths
            time.sleep(0.1)
    finally:
        # torchrun starts its workers in sessions of their own: end everything in the
        # namespaces, not just the process groups of the torchruns.
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for h in hosts:
            netns.kill_namespace_processes(h.ns, grace_s=3.0 if procs else 0.0)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for log in logs:
            log.close()


def exit_failure(host: int, code, timeout_s: float) -> str:
    if code == "hung":
        return f"host {host} hung: killed after {timeout_s:g} s"
    if code == "killed":
        return f"host {host} killed: still running 10 s after another host failed"
    return f"host {host} exited with {code}"


def _dump_stacks(hosts: List[netns.Host]) -> None:
    """SIGABRT to every process left in the namespaces: faulthandler (PYTHONFAULTHANDLER)
    writes each one's Python stacks into its host's log, which shows where it hung."""
    for h in hosts:
        for pid in netns.namespace_pids(h.ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
    time.sleep(1.0)


def check_run(cfg: Config, report: Optional[dict], args) -> List[str]:
    """What is wrong with one run's rank-0 report (empty: it passed)."""
    if report is None:
        return ["rank 0 wrote no report"]
    fails = [f"report: {p}" for p in validate_report(report)]
    if fails:
        return fails
    if report["config"]["world_size"] != cfg.world:
        fails.append(f"world size {report['config']['world_size']}, expected {cfg.world}")
    want_hosts = [f"host{cfg.host_of(r)}" for r in range(cfg.world)]
    if report["config"].get("rank_hosts") != want_hosts:
        fails.append(f"ranks ran on {report['config'].get('rank_hosts')}, expected {want_hosts}")
    for name, why in report["skipped_backends"].items():
        fails.append(f"{name} skipped: {why}")
    groups = expected_groups(cfg)
    for name, desc in report["backends"].items():
        if name.startswith("ringcomm") and desc.get("hosts") != groups:
            fails.append(f"{name} grouped the ranks as {desc.get('hosts')!r}, expected {groups!r}")
    expect = len(args.algos) + (not args.no_gloo)
    if len(report["backends"]) != expect:
        fails.append(f"{len(report['backends'])} backends ran, expected {expect}")
    if not report["results"]:
        fails.append("no results")
    for res in report["results"]:
        for name, cell in res["backends"].items():
            where = f"{res['op']} {format_size(res['size_bytes'])} {name}"
            if "time_us" not in cell:
                fails.append(f"{where}: {cell.get('error') or cell.get('skipped')}")
            elif cell["wrong"] != 0:
                fails.append(f"{where}: {cell['wrong']} wrong elements")
    if report["wrong_total"]:
        fails.append(f"{report['wrong_total']} wrong elements in all")
    return fails


def algorithm_of(name: str, description: dict) -> str:
    """The table's name of a backend: ringcomm's algorithm, or the library."""
    return description.get("algo", "auto") if name.startswith("ringcomm") else name


def rows_of(cfg: Config, run: int, report: dict, rate: Optional[str]) -> List[dict]:
    rows = []
    for res in report["results"]:
        for name, cell in res["backends"].items():
            if "time_us" not in cell:
                continue
            rows.append({
                "hosts": cfg.hosts, "ranks_per_host": cfg.ranks_per_host,
                "placement": cfg.placement, "world_size": cfg.world, "rate": rate, "run": run,
                "op": res["op"], "size_bytes": res["size_bytes"], "type": res["type"],
                "backend": "ringcomm" if name.startswith("ringcomm") else name,
                "algorithm": algorithm_of(name, report["backends"][name]),
                "time_us": cell["time_us"], "algbw_gbps": cell["algbw_gbps"],
                "busbw_gbps": cell["busbw_gbps"], "wrong": cell["wrong"], "iters": cell["iters"],
                "min_us": cell.get("min_us"), "max_us": cell.get("max_us")})
    return rows


# --------------------------------------------------------------------------- output

def header_lines(args, command: str) -> List[str]:
    link = f"tbf {args.rate} on both ends of every veth (both directions)" if args.rate \
        else "unshaped veth"
    return [
        "# ringcomm multi-host harness: each host a network namespace, joined to one Linux "
        f"bridge by a veth pair; {link}",
        f"# CPU: {_cpu_model()}, {os.cpu_count()} cores; "
        + (f"the {len(os.sched_getaffinity(0))} usable CPUs dealt out to the hosts in turn "
           "(each run's `cpus` in the JSON)" if args.pin else "every host on every CPU (--no-pin)"),
        f"# date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"# command: {command}",
        "# launch: torchrun --nnodes H --node-rank i --nproc-per-node R in namespace i, running "
        "ringcomm-bench: every algorithm (its own communicator) and gloo take turns size by size",
        "# time: the bench's median over iterations of the slowest rank's time per call; "
        "one column per run (--repeat)",
    ]


def table_lines(rows: List[dict], repeat: int, algorithms: List[str]) -> List[str]:
    """One line per (configuration, op, size, algorithm): each run's time, then each
    run's busbw. Algorithms in the order given, the peers (gloo) after them."""
    by_key: Dict[tuple, Dict[int, dict]] = {}
    for r in rows:
        key = (r["hosts"], r["ranks_per_host"], PLACEMENTS.index(r["placement"]), r["op"],
               r["size_bytes"], r["backend"] != "ringcomm",
               algorithms.index(r["algorithm"]) if r["algorithm"] in algorithms else 0,
               r["algorithm"])
        by_key.setdefault(key, {})[r["run"]] = r
    width = max([len(k[-1]) for k in by_key] + [9])
    runs = range(1, repeat + 1)
    lead = f"  {'hosts':>5} x {'ranks':<5} {'placement':<11} {'op':<14} {'size':>9}  {'algorithm':<{width}}"
    lines = ["#" + lead[1:] + "".join(f"  {'time' + str(k):>8}" for k in runs)
             + "".join(f"  {'busbw' + str(k):>8}" for k in runs),
             "#" + " " * (len(lead) - 1) + "".join(f"  {'(us)':>8}" for _ in runs)
             + "".join(f"  {'(GB/s)':>8}" for _ in runs)]
    last = None
    for key in sorted(by_key):
        if last is not None and key[:4] != last[:4]:  # a blank line between ops and configs
            lines.append("#")
        last = key
        h, r, place, op, size, algo = key[0], key[1], PLACEMENTS[key[2]], key[3], key[4], key[-1]
        got = by_key[key]
        t = "".join(f"  {format_time(got[k]['time_us']) if k in got else '-':>8}" for k in runs)
        b = "".join(f"  {got[k]['busbw_gbps']:8.3f}" if k in got else f"  {'-':>8}" for k in runs)
        lines.append(f"  {h:>5} x {r:<5} {place:<11} {op:<14} {size:>9}  {algo:<{width}}{t}{b}")
    return lines


def write_outputs(out: str, header: List[str], rows: List[dict], runs: List[dict],
                  failures: List[str], args, command: str) -> None:
    lines = header + ["#"] + table_lines(rows, args.repeat, args.algos)
    lines += ["#", f"# runs: {len(runs)}, failed: {sum(1 for r in runs if r['failures'])}"]
    lines += [f"# FAILED {f}" for f in failures]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".txt", "w") as f:
        f.write(text)
    with open(out + ".json", "w") as f:
        json.dump({"schema": "ringcomm-multihost/1", "command": command, "header": header,
                   "cpu_model": _cpu_model(), "cpu_cores": os.cpu_count(),
                   "rate": args.rate, "algorithms": args.algos, "gloo": not args.no_gloo,
                   "repeat": args.repeat, "rows": rows, "runs": runs, "failures": failures},
                  f, indent=1)
        f.write("\n")
    sys.stdout.write(text)


# --------------------------------------------------------------------------- main

class Terminated(Exception):
    """SIGTERM or SIGHUP: cleaned up and reported as Ctrl-C is."""

    def __init__(self, signum):
        super().__init__(f"signal {signum}")
        self.signum = signum


def _terminate(signum, frame):
    raise Terminated(signum)


def model_path(args, cfg: Config) -> str:
    return os.path.abspath(f"{args.out}_{cfg.hosts}x{cfg.ranks_per_host}_{cfg.placement}_model.json")


def calibrate_once(args, cfg: Config, hosts: List[netns.Host], port: int, workdir: str) -> List[str]:
    """--calibrate: one launch that writes the configuration's parameter file;
    its failures (none: the file is there)."""
    path = model_path(args, cfg)
    bench = ["--backends", "ringcomm", "--timeout", f"{args.call_timeout:g}", "--progress", "off",
             "--calibrate", path, "--calibrate-runs", str(args.calibrate_runs),
             "--calibrate-passes", str(args.calibrate_passes)]
    t0 = time.monotonic()
    codes, logs = launch(cfg, hosts, port, bench, workdir, args.launch_timeout, args.pin)
    fails = [exit_failure(i, c, args.launch_timeout) for i, c in enumerate(codes) if c != 0]
    if not fails and not os.path.exists(path):
        fails.append(f"no parameter file {path} was written")
    what = f"{cfg.label()}, calibration"
    _say_launch(what, fails, codes, logs, f"({time.monotonic() - t0:.1f} s) -> {path}")
    return [f"{what}: {f}" for f in fails]


def _say_launch(what: str, fails: List[str], codes: List[int], logs: List[str], detail: str) -> None:
    """One line per launch on stderr; the end of every host's log when it failed."""
    print(f"multihost.py: {what}: {'FAILED' if fails else 'ok'} {detail}", file=sys.stderr, flush=True)
    if fails:
        for i, log in enumerate(logs):
            print(f"--- {what}, host {i} (exit {codes[i]}), end of its log:\n{_tail(log)}",
                  file=sys.stderr, flush=True)


def run_once(args, cfg: Config, hosts: List[netns.Host], run: int, port: int, workdir: str):
    """One run of one configuration: (its record for the JSON, its table rows)."""
    json_path = os.path.join(workdir, "rank0.json")
    bench = bench_argv(args, json_path)
    t0 = time.monotonic()
    codes, logs = launch(cfg, hosts, port, bench, workdir, args.launch_timeout, args.pin)
    wall = time.monotonic() - t0
    report = None
    if os.path.exists(json_path):
        with open(json_path) as f:
            report = json.load(f)
    fails = [exit_failure(i, c, args.launch_timeout) for i, c in enumerate(codes) if c != 0]
    if report is not None or not fails:
        fails += check_run(cfg, report, args)
    what = f"{cfg.label()}, run {run}"
    _say_launch(what, fails, codes, logs, f"({wall:.1f} s)")
    record = {"hosts": cfg.hosts, "ranks_per_host": cfg.ranks_per_host,
              "placement": cfg.placement, "run": run, "port": port, "exit_codes": codes,
              "wall_s": wall, "failures": [f"{what}: {f}" for f in fails],
              "cpus": [host_cpus(h.index, len(hosts)) for h in hosts] if args.pin else None,
              "bench_command": host_command(cfg, hosts[0], hosts[0].addr, port, bench),
              "report": report}
    return record, rows_of(cfg, run, report, args.rate) if report is not None else []


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    command = shlex.join([sys.executable, os.path.abspath(sys.argv[0] or __file__), *argv])
    reason = netns.unavailable_reason(shaping=args.rate is not None)
    if reason:
        print(f"multihost.py: {reason}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    plan = configs(args.hosts, args.ranks_per_host, args.placement)
    header = header_lines(args, command)
    rows: List[dict] = []
    runs: List[dict] = []
    failures: List[str] = []
    code = 0
    try:
        with tempfile.TemporaryDirectory(prefix="ringcomm-multihost-") as tmp:
            for n_hosts in dict.fromkeys(c.hosts for c in plan):
                with netns.bridged_hosts(n_hosts, PREFIX, SUBNET, args.rate) as hosts:
                    for cfg in (c for c in plan if c.hosts == n_hosts):
                        if args.calibrate:
                            _EXTRA_ENV.pop("RINGCOMM_COST_MODEL", None)
                            workdir = os.path.join(tmp, f"calibrate-{len(runs)}")
                            os.makedirs(workdir)
                            bad = calibrate_once(args, cfg, hosts, BASE_PORT + 500 + len(runs), workdir)
                            failures += bad
                            if bad:
                                continue
                            _EXTRA_ENV["RINGCOMM_COST_MODEL"] = model_path(args, cfg)
                        for run in range(1, args.repeat + 1):
                            # A fresh port each time: no waiting out the last run's sockets.
                            workdir = os.path.join(tmp, str(len(runs)))
                            os.makedirs(workdir)
                            record, got = run_once(args, cfg, hosts, run,
                                                   BASE_PORT + len(runs), workdir)
                            runs.append(record)
                            rows += got
                            failures += record["failures"]
    except (KeyboardInterrupt, Terminated) as e:
        failures.append(f"interrupted ({'Ctrl-C' if isinstance(e, KeyboardInterrupt) else e}): "
                        "the table holds the runs that finished")
        code = 130 if isinstance(e, KeyboardInterrupt) else 128 + e.signum
    except RuntimeError as e:  # the namespaces could not be made
        print(f"multihost.py: {e}", file=sys.stderr)
        failures.append(str(e))
        code = 2
    write_outputs(args.out, header, rows, runs, failures, args, command)
    return code or (1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
