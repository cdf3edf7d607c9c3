"""ringcomm-bench: nccl-tests style bandwidth sweeps, ringcomm side by side with its peers.

    ringcomm-bench                                  # 2 local ranks, ringcomm vs gloo
    ringcomm-bench -b 8 -e 256M -f 2 --ops all --backends ringcomm,gloo --json r.json --plot r.png
    mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 \\
        ringcomm-bench --backends ringcomm,gloo,mpi
    torchrun --nproc-per-node 4 -m ringcomm.bench.cli --ops all_reduce
    ringcomm-bench --simulate --preset dgx-h100-ib400 --plot p.png   # the cost model only (simulate.py)
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import socket
import sys
import traceback
from typing import Dict, List, Optional

from ringcomm.bench import launch
from ringcomm.bench.backends import (BACKEND_NAMES, Backend, BackendUnavailable, DeepSpeedBackend, MpiBackend,
                                     RingcommBackend, TorchBackend, format_host_groups,
                                     same_host_groups)
from ringcomm.bench.buffers import Buffer, Buffers, resolve_dtype
from ringcomm.bench.check import REDOPS
from ringcomm.bench.collectives import COLLECTIVES, resolve_ops
from ringcomm.bench.progress import Progress
from ringcomm.bench.report import Cell, Row, Table, build_report, machine_facts, write_json
from ringcomm.bench.sizes import format_size, parse_size, size_list
from ringcomm.bench.timing import (MAX_SETTLE_CALLS, Control, MemcpyAllReference, MemcpyReference, TimingParams,
                                   measure_side_by_side, prepare)

COMMAND_ENV = "RINGCOMM_BENCH_COMMAND"
# What ringcomm.explain knows (send/recv have no choice to explain).
_EXPLAINED = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "scatter", "gather",
              "all_to_all")

# The default run: every primitive, 8 B .. 32 MiB in steps of 4x, 2 local ranks,
# ringcomm against gloo. About a minute on a 2-core machine.
DEFAULTS = dict(minbytes="8", maxbytes="32M", stepfactor=4, ops="all",
                backends="ringcomm,gloo", nproc=2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ringcomm-bench",
        description="Message-size sweeps of collectives in nccl-tests' format: size, count, "
                    "type, redop, root, then time / algbw / busbw / #wrong per backend, and "
                    "the memcpy bandwidth of the same size measured in the same run.",
        epilog="Sizes take K, M, G suffixes (binary). Runs unchanged under torchrun and "
               "mpirun; --nproc only applies when no launcher started the ranks.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-b", "--minbytes", default=DEFAULTS["minbytes"], help="smallest size (default %(default)s)")
    a("-e", "--maxbytes", default=DEFAULTS["maxbytes"], help="largest size (default %(default)s)")
    a("-f", "--stepfactor", type=int, default=DEFAULTS["stepfactor"],
      help="multiply the size by this (default %(default)s); 1: add --stepbytes instead")
    a("-i", "--stepbytes", default="1M", help="size increment when -f is 1 (default %(default)s)")
    a("-n", "--iters", type=int, default=20,
      help="timed iterations per size, at most (default %(default)s; fewer for large "
           "sizes, see --budget)")
    a("-w", "--warmup", type=int, default=5,
      help="warm-up calls per size, the checked call included (default %(default)s)")
    a("-o", "--op", default="sum", choices=REDOPS, help="reduction (default %(default)s)")
    a("-d", "--dtype", default="float",
      help="data type: float, double, half, bfloat16, int8, uint8, int32, int64 "
           "(numpy spellings accepted; default %(default)s)")
    a("-r", "--root", type=int, default=0, help="root of rooted primitives (default 0)")
    a("-c", "--check", type=int, default=1, choices=(0, 1),
      help="check every size's result and count wrong elements (default 1)")
    a("--ops", default=DEFAULTS["ops"],
      help="'all' or a comma list of " + ", ".join(COLLECTIVES) + " (default %(default)s)")
    a("--backends", default=DEFAULTS["backends"],
      help="comma list of " + ", ".join(BACKEND_NAMES) + " (default %(default)s); "
           "unavailable ones are skipped with a notice")
    a("--nproc", type=int, default=DEFAULTS["nproc"],
      help="local ranks to start when not under torchrun/mpirun (default %(default)s)")
    a("--transport", default=None, help="ringcomm transport (sets RINGCOMM_TRANSPORT): shm, tcp")
    a("--algo", action="append", default=None,
      help="ringcomm algorithm (sets RINGCOMM_ALGO before init): auto, ring, oneshot, "
           "recursive_doubling, ..., or per op (all_reduce:rabenseifner,broadcast:tree). Given "
           "more than once, one ringcomm backend per value, named ringcomm[VALUE], all taking "
           "turns size by size in the same run")
    a("--ringcomm-device", choices=("cpu", "cuda"), default="cpu",
      help="where ringcomm's buffers live: cpu (shared memory / TCP) or cuda (the GPU path: NCCL, and "
           "ringcomm's ring over NCCL with RINGCOMM_GPU_ALGO=ring); rank r uses GPU local_rank %% count")
    a("--ringcomm-buffers", choices=("numpy", "torch"), default="numpy",
      help="what ringcomm is handed on the CPU: numpy arrays, as MPI is (default; bfloat16 has no "
           "numpy type and always goes as a torch tensor), or torch tensors over the same memory "
           "(reading a tensor's pointer through torch's Python API costs ~0.25 us a call)")
    a("--budget", type=float, default=0.4,
      help="seconds of timed iterations per size and backend before -n is cut "
           "(default %(default)s)")
    a("--min-iters", type=int, default=5,
      help="timed iterations per size at least, whatever the budget (default %(default)s)")
    a("--batch-ms", type=float, default=5.0,
      help="each timed iteration runs back-to-back calls for at least this long, so the "
           "barrier's exit skew spreads over many small calls, as in nccl-tests (default "
           "%(default)s); 0: one call per iteration (isolated-call latency)")
    a("--timeout", type=float, default=300.0,
      help="seconds any rendezvous or call may block before failing (default %(default)s)")
    a("--no-memcpy", action="store_true", help="skip the memcpy references")
    a("--socket", action="store_true",
      help="also time a plain TCP socket exchange between ranks 0 and 1 over the address ringcomm's "
           "TCP transport advertises, same sizes, same run (the TCP reference: bench/socket_ref.py)")
    a("--explain", action="store_true",
      help="also print, per size, the algorithm ringcomm runs with its predicted time and the "
           "other candidates' (ringcomm.explain; the JSON gets them too)")
    a("--calibrate", metavar="FILE",
      help="measure ringcomm's cost model parameters on these ranks' links (median of "
           "--calibrate-runs runs) and write them to FILE for RINGCOMM_COST_MODEL=FILE; no sweep")
    a("--calibrate-runs", type=int, default=7, help="runs --calibrate takes the median of (default %(default)s)")
    a("--calibrate-passes", type=int, default=None,
      help="passes of the fit over every family and size, each point the median (default 3)")
    a("--calibrate-no-fit", action="store_true",
      help="--calibrate writes the link parameters only, without timing each schedule family "
           "and fitting its formula (bench/fit.py)")
    a("--simulate", action="store_true",
      help="start no ranks: evaluate ringcomm's cost model for a described topology, 2 to 16,384 "
           "ranks (ringcomm-bench --simulate -h lists its own options)")
    a("--json", metavar="FILE", help="write every figure and the machine facts to FILE")
    a("--plot", metavar="FILE.png", help="draw busbw and latency against size to FILE.png")
    a("--progress", choices=("auto", "on", "off"), default="auto",
      help="progress bar on stderr (auto: only when stderr is a terminal)")
    return p


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.minbytes = parse_size(args.minbytes)
        args.maxbytes = parse_size(args.maxbytes)
        args.stepbytes = parse_size(args.stepbytes)
        args.sizes = size_list(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
        args.ops = resolve_ops(args.ops)
        args.dtype = resolve_dtype(args.dtype)
        args.backends = _resolve_backends(args.backends)
    except ValueError as e:
        parser.error(str(e))
    if args.op == "avg" and not args.dtype.floating:
        parser.error(f"-o avg needs a floating-point type, not {args.dtype.name}")
    if args.iters < 1 or args.min_iters < 1 or args.warmup < 0:
        parser.error("-n and --min-iters must be >= 1, -w >= 0")
    if args.nproc < 1:
        parser.error("--nproc must be >= 1")
    if args.calibrate_runs < 1:
        parser.error("--calibrate-runs must be >= 1")
    if args.calibrate_passes is not None and args.calibrate_passes < 1:
        parser.error("--calibrate-passes must be >= 1")
    if args.calibrate is not None:
        args.backends = ["ringcomm"]
    return args


def _resolve_backends(spec: str) -> List[str]:
    names = []
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name not in BACKEND_NAMES:
            raise ValueError(f"unknown backend {raw!r}; expected some of {', '.join(BACKEND_NAMES)}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("no backend given")
    return names


def _backend_instances(backends: List[str], algos: Optional[List[str]]):
    """(name, ringcomm algorithm) of each backend to create, in order: ringcomm once
    per --algo (named ringcomm[ALGO] when there are several), the others once."""
    out = []
    for name in backends:
        if name != "ringcomm":
            out.append((name, None))
        elif algos and len(algos) > 1:
            out += [(f"ringcomm[{a}]", a) for a in dict.fromkeys(algos)]
        else:
            out.append((name, algos[0] if algos else None))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--simulate" in argv:  # pure arithmetic: no launcher, no torch.distributed
        from ringcomm.bench import simulate

        return simulate.main(argv)
    args = parse_args(argv)
    if not launch.launched_externally() and args.nproc > 1:
        os.environ.setdefault(COMMAND_ENV, shlex.join([*_invocation(), *argv]))
        return launch.spawn(args.nproc, argv)
    if os.environ.get(launch.SPAWNED_ENV):
        launch.die_with_parent()
    return Sweep(args, argv).run()


class Sweep:
    """One rank's part of the sweep (every rank runs this; rank 0 reports)."""

    def __init__(self, args: argparse.Namespace, argv: List[str]):
        self.args, self.argv = args, argv
        self.out = sys.stdout
        self.socket_ref = None  # --socket: the plain TCP reference (bench/socket_ref.py)

    def say(self, text: str) -> None:
        if self.info.rank == 0:
            self.out.write(text + "\n")
            self.out.flush()

    def warn(self, text: str) -> None:
        if self.info.rank == 0:
            print(f"ringcomm-bench: {text}", file=sys.stderr, flush=True)

    def run(self) -> int:
        import torch
        import torch.distributed as dist

        args = self.args
        self.info = info = launch.detect()
        if args.root >= info.world_size or args.root < 0:
            self.warn(f"-r {args.root} is not a rank of a world of {info.world_size}")
            return 2
        if args.nproc != DEFAULTS["nproc"] and info.launcher not in ("spawn", "single") \
                and args.nproc != info.world_size:
            self.warn(f"--nproc {args.nproc} ignored: {info.launcher} started "
                      f"{info.world_size} ranks")
        for notice in info.notices:
            self.warn(notice)
        # One thread per rank for torch's own kernels, so ranks do not fight over cores
        # (gloo reduces in the calling thread either way).
        torch.set_num_threads(1)
        store = self.store = launch.make_store(info, args.timeout)
        dist.init_process_group("gloo", store=dist.PrefixStore("control/", store),
                                rank=info.rank, world_size=info.world_size,
                                timeout=datetime.timedelta(seconds=args.timeout))
        self.control = Control(info.rank, info.world_size)
        try:
            backends, skipped = self.create_backends(store)
            try:
                if args.calibrate is not None:
                    return self.calibrate(backends, store)
                return self.sweep(backends, skipped)
            finally:
                for b in backends:
                    b.close()
                if self.socket_ref is not None:
                    self.socket_ref.close()
        finally:
            dist.destroy_process_group()

    def create_backends(self, store):
        """Every rank creates the same backends in the same order; one that fails
        anywhere is skipped everywhere, with the reason."""
        args, info = self.args, self.info
        backends: List[Backend] = []
        skipped: Dict[str, str] = {}
        if "deepspeed" in args.backends:
            hosts = self.control.gather_objects(socket.gethostname())
            local_size = hosts.count(socket.gethostname())
        for name, algo in _backend_instances(args.backends, args.algo):
            backend, reason = None, None
            try:
                if name.startswith("ringcomm"):
                    backend = RingcommBackend(info.rank, info.world_size, store, args.timeout,
                                              args.transport, algo, args.ringcomm_buffers,
                                              args.ringcomm_device, info.local_rank, name)
                elif name == "mpi":
                    backend = MpiBackend()
                elif name == "deepspeed":
                    backend = DeepSpeedBackend(info.world_size, local_size)
                else:
                    backend = TorchBackend(name, info.rank, info.world_size, info.local_rank,
                                           args.timeout)
            except BackendUnavailable as e:
                reason = str(e)
            except Exception as e:
                reason = f"{type(e).__name__}: {e}".splitlines()[0]
                print(f"rank {info.rank}: {name} failed to start:\n{traceback.format_exc()}",
                      file=sys.stderr, flush=True)
            reasons = [r for r in self.control.gather_objects(reason) if r]
            if reasons:
                if backend is not None:
                    backend.close()
                skipped[name] = reasons[0]
                self.warn(f"skipping {name}: {reasons[0]}")
            else:
                backends.append(backend)
        return backends, skipped

    def calibrate(self, backends: List[Backend], store) -> int:
        """--calibrate: the median of several measurements of every parameter,
        then (unless --calibrate-no-fit) each family's formula fitted to its
        measured times (bench/fit.py); written by rank 0 (every rank measures
        the same runs)."""
        from ringcomm import cost_model

        ring = next((b for b in backends if isinstance(b, RingcommBackend)), None)
        if ring is None:
            self.warn("--calibrate needs the ringcomm backend, which could not start")
            return 1
        runs = [ring.comm.recalibrate() for _ in range(self.args.calibrate_runs)]

        params = {link: {k: cost_model.median([r[link][k] for r in runs], f"{link}.{k}")
                         for k in ("alpha", "beta", "overhead")}
                  for link in ("intra", "inter")}
        params["gamma"] = cost_model.median([r["gamma"] for r in runs], "gamma")
        hosts = self.control.gather_objects(machine_facts())
        topo = ring.comm.host_of()
        measured = {"intra": any(topo.count(h) > 1 for h in set(topo)), "inter": len(set(topo)) > 1}
        fits = None
        if not self.args.calibrate_no_fit and self.info.world_size > 1:
            # The formulas the fit corrects are this communicator's own, with the
            # parameters just measured: its ring order (RINGCOMM_RING_ORDER) and
            # limits are those of the runs the file is for.
            ring.comm.set_cost_params(params)
            fits = self.fit_families(store, _Explained(ring.comm))
            if fits is None:
                return 1
            params["fit"] = fits
            params["fit_for"] = [self.info.world_size, len(set(topo))]
        if self.info.rank == 0:
            cost_model.save(self.args.calibrate, params, cpu=hosts[0]["cpu_model"],
                            hosts=len(set(topo)), world_size=self.info.world_size,
                            measured_links=[k for k, v in measured.items() if v],
                            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            runs=self.args.calibrate_runs)
            self.say(f"# ringcomm-bench --calibrate: {self.info.world_size} ranks on {len(set(topo))} host(s), "
                     f"{hosts[0]['cpu_model']}; median of {self.args.calibrate_runs} runs")
            for link in ("intra", "inter"):
                p = params[link]
                note = "" if measured[link] else "  (not measured: no such pair of ranks; the default)"
                self.say(f"#  {link}: alpha {p['alpha'] * 1e6:.2f} us, {1 / p['beta'] / 1e9:.2f} GB/s, "
                         f"overhead {p['overhead'] * 1e6:.2f} us per further message{note}")
            self.say(f"#  reduction: {1 / params['gamma'] / 1e9:.2f} GB/s")
            if fits is not None:
                from ringcomm.bench.fit import FIT_SIZES

                self.say(f"#  measured / formula per family at {', '.join(format_size(s) for s in FIT_SIZES)} "
                         f"(the model multiplies its formula by these, interpolated between sizes):")
                for name, pts in fits.items():
                    self.say(f"#    {name:<32} " + " ".join(f"{r:6.2f}" for _, r in pts))
            self.say(f"# written to {self.args.calibrate}; use it with RINGCOMM_COST_MODEL={self.args.calibrate}")
        return 0

    def fit_families(self, store, model):
        """The fit of every candidate family (bench/fit.py), or None after a
        failure (said)."""
        from ringcomm.bench import fit

        args, info = self.args, self.info
        saved = {k: os.environ.get(k) for k in ("RINGCOMM_ALGO", "RINGCOMM_COST_MODEL")}
        # A forced family does not consult the model: no need to measure it again.
        os.environ["RINGCOMM_COST_MODEL"] = "default"
        try:
            def make_backend(family):
                return RingcommBackend(info.rank, info.world_size, store, args.timeout, args.transport,
                                       family, "numpy", "cpu", info.local_rank, f"fit[{family}]")

            timing = TimingParams(iters=9, warmup=3, min_iters=3, budget_s=0.25, check=True)
            points, failures = fit.measure_families(
                self.control, make_backend, model, args.dtype, timing,
                on_error=lambda text: print(text, file=sys.stderr, flush=True),
                passes=args.calibrate_passes or fit.FIT_PASSES)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if failures:
            self.warn("--calibrate: the fit failed: " + "; ".join(failures[:5]))
            return None
        return fit.fit_table(points)

    def sweep(self, backends: List[Backend], skipped: Dict[str, str]) -> int:
        args, info, control = self.args, self.info, self.control
        n, rank = info.world_size, info.rank
        names = [b.name for b in backends]
        mpi = next((b for b in backends if isinstance(b, MpiBackend)), None)
        ring = next((b for b in backends if isinstance(b, RingcommBackend) and b.device == "cpu"), None) \
            if args.explain else None
        hosts = control.gather_objects(machine_facts(
            mpi.describe()["library"] if mpi is not None else None))
        unique_hosts = list(dict.fromkeys(h["host_id"] for h in hosts))
        params = TimingParams(iters=args.iters, warmup=args.warmup, min_iters=args.min_iters,
                              budget_s=args.budget, batch_s=args.batch_ms / 1e3,
                              check=bool(args.check))
        memcpy = None if args.no_memcpy else MemcpyReference(control, _max_buffer(args, n))
        memcpy_all = None if args.no_memcpy else MemcpyAllReference(control, _max_buffer(args, n))
        sock = None
        if args.socket and n > 1:
            from ringcomm.bench.socket_ref import SocketReference

            sock = self.socket_ref = SocketReference(control, self.store, _max_buffer(args, n), args.timeout)
        descriptions = {b.name: b.describe() for b in backends}
        for b in backends:
            if isinstance(b, RingcommBackend):  # how ringcomm grouped the ranks (all call this)
                descriptions[b.name]["hosts"] = format_host_groups(
                    same_host_groups(control.gather_objects(b.comm.transports)))
        self.preamble(hosts, unique_hosts, descriptions, skipped)
        if not backends:
            self.warn("no backend could run; nothing to measure")
            return 1

        refs = ([memcpy, memcpy_all] if memcpy is not None else []) + ([sock] if sock is not None else [])
        steps = len(args.ops) * len(args.sizes) * (len(backends) + len(refs))
        progress = Progress(steps, {"auto": None, "on": True, "off": False}[args.progress]
                            ) if rank == 0 else Progress(steps, False)
        rows: List[Row] = []
        failed = False
        for op in args.ops:
            coll = COLLECTIVES[op]
            redop = args.op if coll.reduces else "none"
            root = args.root if coll.rooted else -1
            table = Table(self.out, op, names, memcpy is not None, explain=ring is not None,
                          socket=sock is not None)
            if rank == 0:
                table.header({b.name: b.notes[key] for b in backends
                              for key in (op, redop) if key in b.notes})
            dead: Dict[str, str] = {}
            seen = set()
            for k, size in enumerate(args.sizes):
                layout = coll.layout(size, args.dtype.itemsize, n)
                if layout is None or layout.size in seen:
                    progress.done += len(backends) + len(refs)
                    continue
                seen.add(layout.size)
                row = Row(op, layout.size, layout.count, args.dtype.label, redop, root,
                          coll.factor(n))
                if ring is not None and op in _EXPLAINED:
                    row.explain = ring.comm.explain(op, layout.size)
                buffers: Dict[str, Buffers] = {}
                # Take turns, and rotate who goes first, so drift hits every backend
                # alike: the checks and warm-ups one after another, then the samples
                # in turns (timing.measure_side_by_side).
                order: list = list(backends) + refs
                order = order[k % len(order):] + order[:k % len(order)]
                prepared = []
                for b in order:
                    label = f"{op} {format_size(layout.size)} {b.name}"
                    if b in refs:
                        setattr(row, b.name, b.measure(layout.size, params))
                        progress.step(label)
                        continue
                    reason = dead.get(b.name) or b.unsupported(coll, args.dtype, args.op)
                    if reason:
                        row.cells[b.name] = Cell(skipped=reason)
                        progress.step(label)
                        continue
                    if b.device not in buffers:
                        buffers[b.device] = _allocate(layout, args.dtype, b.device)
                    bufs = buffers[b.device]
                    prepared.append(prepare(control, b,
                                            lambda b=b, bufs=bufs: b.bind(coll, bufs, args.op, args.root),
                                            coll, layout, bufs, args.op, args.root, args.dtype, params,
                                            on_error=lambda text: print(text, file=sys.stderr, flush=True)))
                for prep, m in zip(prepared, measure_side_by_side(control, prepared)):
                    b = prep.backend
                    if m.error:
                        dead[b.name] = f"failed earlier: {m.error}"
                        failed = True
                    row.cells[b.name] = Cell(measurement=m)
                    progress.step(f"{op} {format_size(layout.size)} {b.name}")
                del buffers
                rows.append(row)
                if rank == 0:
                    progress.clear()
                    table.row(row)
            if rank == 0:
                progress.clear()
                table.footer()
        wrong = sum(c.measurement.wrong for r in rows for c in r.cells.values()
                    if c.measurement is not None and c.measurement.wrong > 0)
        if rank == 0:
            self.write_outputs(rows, hosts, descriptions, skipped)
        return 1 if wrong or failed else 0

    def preamble(self, hosts, unique_hosts, descriptions, skipped) -> None:
        args, info = self.args, self.info
        h = hosts[0]
        per_host = info.world_size // max(len(unique_hosts), 1)
        backend_text = []
        for name, d in descriptions.items():
            extra = ", ".join(f"{k} {v}" for k, v in d.items() if k != "version")
            backend_text.append(f"{name} {d.get('version', '')}" + (f" ({extra})" if extra else ""))
        self.say(f"# ringcomm-bench: nccl-tests columns and busbw factors "
                 f"(github.com/NVIDIA/nccl-tests doc/PERFORMANCE.md)")
        self.say(f"#  world size {info.world_size}: {per_host} rank(s) on each of "
                 f"{len(unique_hosts)} host(s), launched by {info.launcher}")
        self.say(f"#  host {h['hostname']}: {h['cpu_model']}, {h['cpu_cores']} cores; "
                 f"python {h['python']}, numpy {h['numpy']}, torch {h['torch']}")
        self.say(f"#  backends: {'; '.join(backend_text) or 'none'}")
        for name, why in skipped.items():
            self.say(f"#  skipped: {name} ({why})")
        if not args.no_memcpy:
            self.say("#  memcpy: np.copyto between page-aligned buffers, 1 thread, on rank 0 "
                     "(the others idle), same sizes, same run; memcpy_n: the same on every rank "
                     "at once (each its own buffers), the slowest rank's time")
        if self.socket_ref is not None:
            self.say("#  socket: ranks 0 and 1 each send the size to the other over one plain TCP connection "
                     "(TCP_NODELAY) between the addresses ringcomm's TCP transport advertises, at once; "
                     "GB/s = size / time (one direction)")
        self.say(f"#  sizes {format_size(args.sizes[0])} .. {format_size(args.sizes[-1])}, "
                 + (f"x{args.stepfactor}" if args.stepfactor > 1 else f"+{args.stepbytes} B")
                 + f"; type {args.dtype.label}; redop {args.op}; root {args.root}; "
                 f"check {'on' if args.check else 'off'}")
        self.say(f"#  iterations: warm-up up to {args.warmup} (ringcomm's auto: then on while its tuner "
                 f"tries candidates, up to {MAX_SETTLE_CALLS} calls), timed {args.min_iters}..{args.iters}"
                 f" (fewer when a size would take over {args.budget:g} s)")
        self.say("#  time = median over iterations of the slowest rank's time per call. An "
                 "iteration is a barrier of the")
        if args.batch_ms > 0:
            self.say(f"#         measured backend, then back-to-back calls for >= "
                     f"{args.batch_ms:g} ms (1 call for large sizes; --batch-ms 0: always 1).")
        else:
            self.say("#         measured backend, then one call (--batch-ms 0).")
        self.say("#         Backends take turns size by size.")

    def write_outputs(self, rows, hosts, descriptions, skipped) -> None:
        args, info = self.args, self.info
        if not (args.json or args.plot):
            return
        command = os.environ.get(COMMAND_ENV) or shlex.join([*_invocation(), *self.argv])
        if info.launcher == "mpirun":  # mpirun's own options are not visible to us
            command = f"mpirun -np {info.world_size} " + command
        elif info.launcher == "torchrun":
            command = f"torchrun --nproc-per-node {os.environ.get('LOCAL_WORLD_SIZE', '?')} " \
                      f"--nnodes {os.environ.get('GROUP_WORLD_SIZE', '?')} " + command
        config = {
            "world_size": info.world_size, "launcher": info.launcher,
            "hosts": len({h["host_id"] for h in hosts}),
            "rank_hosts": [h["host_id"] for h in hosts],
            "ops": args.ops, "backends": args.backends,
            "dtype": args.dtype.name, "redop": args.op, "root": args.root,
            "minbytes": args.minbytes, "maxbytes": args.maxbytes,
            "stepfactor": args.stepfactor, "stepbytes": args.stepbytes,
            "iters": args.iters, "min_iters": args.min_iters, "warmup": args.warmup,
            "budget_s": args.budget, "check": bool(args.check),
            "transport": args.transport, "algo": args.algo,
            "batch_ms": args.batch_ms,
            "timing": ("time_us = median over iterations of the slowest rank's time per call; "
                       "an iteration = a barrier of the measured backend, then 'batch' "
                       "back-to-back calls lasting >= batch_ms; backends alternate size by "
                       "size; samples_us = per-iteration time per call (slowest rank)"),
            "memcpy": None if args.no_memcpy else
            "np.copyto, page-aligned buffers, 1 thread, rank 0; gbps = size / time; memcpy_all: "
            "the same on every rank at once, the slowest rank's time",
        }
        report = build_report(command=shlex.split(command), config=config, hosts=hosts,
                              backends=descriptions, skipped=skipped, rows=rows, ops=args.ops)
        if args.json:
            write_json(args.json, report)
            self.warn(f"wrote {args.json}")
        if args.plot:
            from ringcomm.bench.plot import plot_report

            plot_report(report, args.plot)
            self.warn(f"wrote {args.plot}")


def _invocation() -> List[str]:
    """How this program was started, for the record: ringcomm-bench, python -m, or a script."""
    prog = sys.argv[0] if sys.argv and sys.argv[0] else "ringcomm-bench"
    if os.path.basename(prog) == "ringcomm-bench":
        return ["ringcomm-bench"]
    if prog.endswith(os.path.join("ringcomm", "bench", "cli.py")):
        return ["python", "-m", "ringcomm.bench.cli"]
    return ["python", prog]


class _Explained:
    """A communicator's own model as fit.measure_families reads one (predict):
    the candidates it predicts (explain's unmodelled ones, the pulls of large
    calls, have no formula to correct)."""

    def __init__(self, comm):
        self.comm = comm

    def predict(self, op, nbytes):
        return [(name, t) for name, t in self.comm.explain(op, nbytes) if t == t]


def _allocate(layout, dtype, device: str) -> Buffers:
    inp = Buffer(layout.in_count, dtype, device) if layout.in_count else None
    return Buffers(input=inp, output=Buffer(layout.out_count, dtype, device))


def _max_buffer(args, n: int) -> int:
    """Largest size column of the sweep (the memcpy reference copies that many bytes)."""
    biggest = 0
    for op in args.ops:
        for size in args.sizes:
            layout = COLLECTIVES[op].layout(size, args.dtype.itemsize, n)
            if layout is not None:
                biggest = max(biggest, layout.size)
    return max(biggest, 1)


if __name__ == "__main__":
    sys.exit(main())
