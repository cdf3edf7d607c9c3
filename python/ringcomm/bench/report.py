"""Output: the nccl-tests table on stdout, the JSON file, and the machine facts.

The table keeps nccl-tests' columns and number formats. Where nccl-tests prints an
out-of-place and an in-place group of (time, algbw, busbw, #wrong), we print one
group per backend, so the libraries compare row by row, and a last column with the
memcpy bandwidth of the same size measured in the same run. Each primitive's table
ends with nccl-tests' footer lines, one "Avg bus bandwidth" line per backend.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import socket
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, TextIO, Tuple

from ringcomm.bench.timing import Measurement

SCHEMA = "ringcomm-bench/1"
GROUP_WIDTH = 32  # "  %7s  %6s  %6s  %5s"


@dataclass
class Cell:
    """One backend's result for one row: a measurement, or why there is none."""

    measurement: Optional[Measurement] = None
    skipped: Optional[str] = None

    def figures(self, size: int, factor: float) -> Dict[str, float]:
        m = self.measurement
        if m is None or m.error or not m.samples_s:
            return {}
        t = m.time_s
        algbw = size / t / 1e9 if t > 0 else 0.0
        return {"time_us": t * 1e6, "algbw_gbps": algbw, "busbw_gbps": algbw * factor}


@dataclass
class Row:
    op: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    factor: float
    cells: Dict[str, Cell] = field(default_factory=dict)
    memcpy: Optional[Measurement] = None
    memcpy_all: Optional[Measurement] = None  # every rank copying at once (timing.MemcpyAllReference)
    socket: Optional[Measurement] = None  # --socket: a plain TCP exchange, ranks 0 and 1 (socket_ref.py)
    # --explain: ringcomm's candidates (name, predicted seconds), what it runs first
    explain: Optional[List[Tuple[str, float]]] = None

    def reference_gbps(self, m: Optional[Measurement]) -> Optional[float]:
        """size / time of one of the row's references (memcpy, memcpy_all, socket)."""
        if m is None or not m.samples_s:
            return None
        return self.size / m.time_s / 1e9

    def memcpy_gbps(self) -> Optional[float]:
        return self.reference_gbps(self.memcpy)

    def memcpy_all_gbps(self) -> Optional[float]:
        return self.reference_gbps(self.memcpy_all)

    def socket_gbps(self) -> Optional[float]:
        return self.reference_gbps(self.socket)


def format_time(us: float) -> str:
    """nccl-tests' time format: fewer decimals as the number grows."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


class Table:
    """Prints one primitive's table, row by row as results arrive (rank 0 only)."""

    def __init__(self, out: TextIO, op: str, backends: List[str], memcpy: bool, explain: bool = False,
                 socket: bool = False):
        self.out, self.op, self.backends, self.memcpy = out, op, backends, memcpy
        self.socket = socket
        self.explain = explain
        self.rows: List[Row] = []

    def header(self, notes: Dict[str, str]) -> None:
        w = self.out.write
        w("#\n")
        for backend, note in notes.items():
            w(f"# {self.op}, {backend}: {note}\n")
        groups = "".join(f"{b:^{GROUP_WIDTH}}" for b in self.backends)
        tail = f"  {'memcpy':>8}  {'memcpy_n':>8}" if self.memcpy else ""
        if self.socket:
            tail += f"  {'socket':>8}  {'socket':>8}"
        if self.explain:
            tail += f"  {'ringcomm runs':>18}  {'predicted':>9}  {'other candidates (predicted us)'}"
        w(f"# {self.op:<50}{groups}{tail}\n")
        names = "".join(f"  {'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}"
                        for _ in self.backends)
        w(f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}{names}"
          f"{'  ' + format('(GB/s)', '>8') + '  ' + format('(GB/s)', '>8') if self.memcpy else ''}"
          f"{'  ' + format('(us)', '>8') + '  ' + format('(GB/s)', '>8') if self.socket else ''}"
          f"{'  ' + format('', '>18') + '  ' + format('(us)', '>9') if self.explain else ''}\n")
        units = "".join(f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}"
                        for _ in self.backends)
        w(f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}{units}\n")
        self.out.flush()

    def row(self, row: Row) -> None:
        self.rows.append(row)
        line = f"{row.size:12d}  {row.count:12d}  {row.type:>8}  {row.redop:>6}  {row.root:6d}"
        for b in self.backends:
            line += self._cell(row, row.cells.get(b, Cell(skipped="not run")))
        if self.memcpy:
            for gbps in (row.memcpy_gbps(), row.memcpy_all_gbps()):
                line += f"  {gbps:8.2f}" if gbps is not None else f"  {'-':>8}"
        if self.socket:
            gbps = row.socket_gbps()
            line += (f"  {format_time(row.socket.time_s * 1e6):>8}  {gbps:8.2f}" if gbps is not None
                     else f"  {'-':>8}  {'-':>8}")
        if self.explain and row.explain:
            (name, t), rest = row.explain[0], row.explain[1:]
            others = " ".join(f"{n} {format_time(x * 1e6).strip()}" for n, x in rest)
            line += f"  {name:>18}  {format_time(t * 1e6) if math.isfinite(t) else '-':>9}  {others}"
        self.out.write(line + "\n")
        self.out.flush()

    @staticmethod
    def _cell(row: Row, cell: Cell) -> str:
        m = cell.measurement
        if m is None or m.error:
            label = "error" if m is not None else "n/a"
            return f"  {label:>7}  {'-':>6}  {'-':>6}  {'-':>5}"
        fig = cell.figures(row.size, row.factor)
        wrong = f"{m.wrong:5d}" if m.wrong >= 0 else f"{'N/A':>5}"
        return (f"  {format_time(fig['time_us'])}  {fig['algbw_gbps']:6.2f}"
                f"  {fig['busbw_gbps']:6.2f}  {wrong}")

    def footer(self) -> None:
        w = self.out.write
        wrong = sum(c.measurement.wrong for r in self.rows for c in r.cells.values()
                    if c.measurement is not None and c.measurement.wrong > 0)
        errors = sum(1 for r in self.rows for c in r.cells.values()
                     if c.measurement is not None and c.measurement.error)
        status = "FAILED" if wrong or errors else "OK"
        w(f"# {'Out of bounds values':<20} : {wrong} {status}\n")
        if errors:
            w(f"# {'Failed calls':<20} : {errors} (tracebacks on stderr)\n")
        for b, avg in summarize(self.rows, self.backends).items():
            if avg["avg_busbw_gbps"] is None:
                continue
            ref = ""
            if avg["memcpy_gbps"]:
                ref = f"  ({100 * avg['avg_busbw_gbps'] / avg['memcpy_gbps']:.0f}% of memcpy"
                if avg.get("memcpy_all_gbps"):
                    ref += f", {100 * avg['avg_busbw_gbps'] / avg['memcpy_all_gbps']:.0f}% of memcpy_n"
                ref += ")"
            w(f"# {'Avg bus bandwidth':<20} : {avg['avg_busbw_gbps']:g} {b}{ref}\n")
        w("#\n")
        self.out.flush()


def summarize(rows: List[Row], backends: List[str]) -> Dict[str, Dict[str, Optional[float]]]:
    """Per backend: the mean busbw over its measured rows (nccl-tests' "Avg bus
    bandwidth") and the mean memcpy bandwidth over the same rows."""
    out = {}
    for b in backends:
        busbw, memcpy, memcpy_all = [], [], []
        for r in rows:
            fig = r.cells.get(b, Cell()).figures(r.size, r.factor)
            if fig:
                busbw.append(fig["busbw_gbps"])
                m = r.memcpy_gbps()
                if m is not None:
                    memcpy.append(m)
                m = r.memcpy_all_gbps()
                if m is not None:
                    memcpy_all.append(m)
        out[b] = {"avg_busbw_gbps": sum(busbw) / len(busbw) if busbw else None,
                  "memcpy_gbps": sum(memcpy) / len(memcpy) if memcpy else None,
                  "memcpy_all_gbps": sum(memcpy_all) / len(memcpy_all) if memcpy_all else None,
                  "rows": len(busbw)}
    return out


# --------------------------------------------------------------------------- machine

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _version(module: str) -> Optional[str]:
    try:
        from importlib import metadata

        return metadata.version(module)
    except Exception:
        mod = sys.modules.get(module)
        return getattr(mod, "__version__", None) if mod else None


def machine_facts(mpi_library: Optional[str] = None) -> Dict[str, object]:
    """Facts about this host and its software (called on every rank, kept per host)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    import numpy

    torch = sys.modules.get("torch")
    return {
        "hostname": socket.gethostname(),
        "host_id": _host_id(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": usable,
        "memory_bytes": _memory_bytes(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": getattr(torch, "__version__", None),
        "ringcomm": _version("ringcomm"),
        "mpi4py": _version("mpi4py"),
        "mpi_library": mpi_library,
        "cuda_devices": _cuda_devices(torch),
    }


def _host_id() -> str:
    """ringcomm's host identity (RINGCOMM_HOST_ID, else hostname + boot id): network
    namespaces and containers share a hostname, and are told apart by it."""
    try:
        from ringcomm.bootstrap import host_identity
    except ImportError:  # the core is not built: the bench still runs its other backends
        return os.environ.get("RINGCOMM_HOST_ID") or socket.gethostname()
    return host_identity()


def _cuda_devices(torch) -> List[str]:
    try:
        if torch is not None and torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    return []


# --------------------------------------------------------------------------- JSON

def _clean(x):
    """JSON has no NaN/inf: write null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def row_to_json(row: Row) -> Dict[str, object]:
    cells = {}
    for b, cell in row.cells.items():
        m = cell.measurement
        if m is None:
            cells[b] = {"skipped": cell.skipped}
        elif m.error:
            cells[b] = {"error": m.error}
        else:
            fig = cell.figures(row.size, row.factor)
            cells[b] = {**{k: _clean(v) for k, v in fig.items()},
                        "wrong": m.wrong if m.wrong >= 0 else None,
                        "iters": len(m.samples_s), "batch": m.batch, "warmup": m.warmup,
                        "min_us": min(m.samples_s) * 1e6, "max_us": max(m.samples_s) * 1e6,
                        "samples_us": [s * 1e6 for s in m.samples_s]}
    def reference(m: Optional[Measurement]):
        if m is None or not m.samples_s:
            return None
        return {"time_us": m.time_s * 1e6, "gbps": row.reference_gbps(m), "iters": len(m.samples_s),
                "batch": m.batch, "samples_us": [s * 1e6 for s in m.samples_s]}

    memcpy, memcpy_all, sock = reference(row.memcpy), reference(row.memcpy_all), reference(row.socket)
    return {"op": row.op, "size_bytes": row.size, "count": row.count, "type": row.type,
            "redop": row.redop, "root": row.root, "busbw_factor": row.factor,
            "backends": cells, "memcpy": memcpy, "memcpy_all": memcpy_all, "socket": sock,
            "explain": None if row.explain is None else [[n, _clean(t)] for n, t in row.explain]}


def build_report(*, command: List[str], config: Dict[str, object], hosts: List[Dict],
                 backends: Dict[str, Dict], skipped: Dict[str, str],
                 rows: List[Row], ops: List[str]) -> Dict[str, object]:
    by_op = {op: [r for r in rows if r.op == op] for op in ops}
    hosts = list({h.get("host_id", h.get("hostname")): h for h in hosts}.values())  # one per host
    names = [b for b in backends]
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": hosts[0] if hosts else {},
        "hosts": hosts,
        "config": config,
        "backends": backends,
        "skipped_backends": skipped,
        "results": [row_to_json(r) for r in rows],
        "summary": {op: summarize(rs, names) for op, rs in by_op.items()},
        "wrong_total": sum(c.measurement.wrong for r in rows for c in r.cells.values()
                           if c.measurement is not None and c.measurement.wrong > 0),
    }


def write_json(path: str, report: Dict[str, object]) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1, allow_nan=False)
        f.write("\n")


REQUIRED_KEYS = {
    "report": ["schema", "date", "command", "machine", "hosts", "config", "backends",
               "skipped_backends", "results", "summary", "wrong_total"],
    "machine": ["hostname", "cpu_model", "cpu_cores", "python", "numpy", "torch",
                "ringcomm", "mpi4py", "mpi_library"],
    "config": ["world_size", "launcher", "ops", "backends", "dtype", "redop", "root",
               "minbytes", "maxbytes", "stepfactor", "iters", "warmup", "check", "timing"],
    "result": ["op", "size_bytes", "count", "type", "redop", "root", "busbw_factor",
               "backends", "memcpy"],
    "cell": ["time_us", "algbw_gbps", "busbw_gbps", "wrong", "iters", "samples_us"],
}


def validate_report(report: Dict[str, object]) -> List[str]:
    """Problems with a report's shape (empty list: fine). Used by the tests."""
    problems = []

    def need(obj, kind, where):
        if not isinstance(obj, dict):
            problems.append(f"{where}: not an object")
            return
        for key in REQUIRED_KEYS[kind]:
            if key not in obj:
                problems.append(f"{where}: missing {key!r}")

    need(report, "report", "report")
    if problems:
        return problems
    if report["schema"] != SCHEMA:
        problems.append(f"schema is {report['schema']!r}, expected {SCHEMA!r}")
    need(report["machine"], "machine", "machine")
    need(report["config"], "config", "config")
    for i, res in enumerate(report["results"]):
        need(res, "result", f"results[{i}]")
        for b, cell in res.get("backends", {}).items():
            if "skipped" in cell or "error" in cell:
                continue
            need(cell, "cell", f"results[{i}].backends.{b}")
    return problems
