"""ringcomm-bench --simulate: the cost model evaluated for a described topology.

No rank is started and torch.distributed is never touched: every figure is the
model's prediction (csrc/comm/cost_model.cpp, alpha-beta-gamma per schedule
step over the rank -> host map), for hosts x ranks-per-host from 2 to 16,384
ranks. Per op, world size and size it prints every algorithm's predicted time
and busbw (nccl-tests' factors, collectives.py) with the pick (what `auto`
runs) marked, and writes --json and --plot.

    ringcomm-bench --simulate --preset dgx-h100-ib400 --max-ranks 16384 --plot p.png
    ringcomm-bench --simulate --ranks-per-host 4 --inter-gbps 12.5 --inter-alpha-us 20
    ringcomm-bench --simulate --params measured.json --ranks-per-host 2

A preset is a topology with parameters whose every figure names its source;
published NCCL figures for the same machine, where there are any, are shown
beside the prediction as reference points (never fed into the model beyond
what the preset's sources say).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from ringcomm.bench.collectives import COLLECTIVES
from ringcomm.bench.sizes import format_size, parse_size, size_list

FORMAT = "ringcomm-simulate/1"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
# Sizes of the per-rank-share ops below one float per rank are skipped, as
# nccl-tests (and the sweep, collectives.Collective.layout) skip them.
_ITEMSIZE = 4


@dataclass(frozen=True)
class Reference:
    """A published measurement of the same machine, shown beside the model."""

    op: str
    ranks_per_host: int
    hosts: int
    busbw_gbps: float
    label: str
    source: str
    min_size: int = 256 << 20  # "large sizes": where the figure applies


@dataclass(frozen=True)
class Preset:
    name: str
    ranks_per_host: int
    params: dict
    description: str
    sources: Sequence[str]
    references: Sequence[Reference] = ()
    no_reference: str = ""  # why there is no reference point, when there is none


def _link(alpha_us: float, gbps: float, overhead_us: float) -> dict:
    return {"alpha": alpha_us / 1e6, "beta": 1 / (gbps * 1e9), "overhead": overhead_us / 1e6}


# TCP over a 1500-byte MTU carries 1448 payload bytes (20 IP + 20 TCP + 12
# timestamp option) per 1538 bytes on the wire (+14 Ethernet header, 4 FCS,
# 8 preamble, 12 inter-frame gap): 94.1% of the line rate.
_TCP_GOODPUT = 1448 / 1538

# The 2-core CPU hosts of this project: ringcomm's own defaults
# (default_cost_params in csrc/comm/cost_model.cpp), measured here.
_CPU_SOURCES = (
    "intra (shared memory): alpha 3 us, 5 GB/s, 0.3 us per further message: ringcomm's defaults "
    "(csrc/comm/cost_model.cpp default_cost_params), measured on this project's 2-core VMs (a "
    "shared-memory flag seen by a spinning peer in 0.2 us, 2.9 us when the spin yields; single-"
    "thread memcpy 12.4 GB/s, halved by copy-in/copy-out)",
    "inter alpha 60 us, 4 us per further message: ringcomm's defaults, a TCP hop measured between "
    "these VMs (waking a receiver blocked in a syscall costs tens of us here; TCP loopback one-"
    "way 4 B took 77 us)",
    "gamma 8 GB/s: ringcomm's default (np.add measured 5.5 GB/s out of place, 7.8 in place, one "
    "thread)",
)

PRESETS: Dict[str, Preset] = {p.name: p for p in [
    Preset(
        "cpu-10gbe", 2,
        {"intra": _link(3, 5, 0.3), "inter": _link(60, 1.25 * _TCP_GOODPUT, 4), "gamma": 1 / 8e9, "nics": 1},
        "2-core CPU hosts, 2 ranks per host over shared memory, hosts on 10 GbE (one port per host)",
        _CPU_SOURCES + (
            "inter bandwidth: 10 GbE line rate 1.25 GB/s x 1448/1538 (TCP payload per MTU frame on "
            "the wire) = 1.18 GB/s",),
        no_reference="NCCL publishes no figures for CPU hosts on TCP: no reference points"),
    Preset(
        "cpu-1gbe", 2,
        {"intra": _link(3, 5, 0.3), "inter": _link(60, 0.125 * _TCP_GOODPUT, 4), "gamma": 1 / 8e9, "nics": 1},
        "2-core CPU hosts, 2 ranks per host over shared memory, hosts on 1 GbE (one port per host)",
        _CPU_SOURCES + (
            "inter bandwidth: 1 GbE line rate 125 MB/s x 1448/1538 (TCP payload per MTU frame on "
            "the wire) = 118 MB/s",),
        no_reference="NCCL publishes no figures for CPU hosts on TCP: no reference points"),
    Preset(
        "dgx-h100-ib400", 8,
        {"intra": _link(2, 370, 0.2), "inter": _link(5, 47, 0.5), "gamma": 1 / 1.1e12, "nics": 8},
        "DGX H100 nodes: 8 GPUs per node over NVLink 4 / NVSwitch, nodes on 400 Gb/s NDR "
        "InfiniBand with one NIC per GPU (nics 8)",
        (
            "intra bandwidth 370 GB/s: NVLink 4 line rate is 450 GB/s per direction per H100 (18 "
            "links, 900 GB/s bidirectional, NVIDIA H100 datasheet); NCCL's maintainer: 'with the "
            "protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s' "
            "(S. Jeaugey, github.com/NVIDIA/nccl-tests/issues/212, 2024-05-06)",
            "inter bandwidth 47 GB/s per NIC: NDR line rate 400 Gb/s = 50 GB/s; NCCL's maintainers: "
            "'For NDR @ 400Gbps you should see 46-48GB/s per NIC' (github.com/NVIDIA/nccl-tests/"
            "issues/290, 2025-03-03)",
            "nics 8: one ConnectX-7 NIC per GPU (DGX H100), so the 8 ranks of a node cross to other "
            "nodes on 8 independent links",
            "gamma 1.1 TB/s: H100 SXM HBM3 3.35 TB/s (datasheet) over the 3 bytes moved per byte "
            "reduced (two reads, one write)",
            "alpha 2 us (NVLink) and 5 us (IB), overhead 0.2 / 0.5 us per further message: our "
            "estimates, not published figures (a flag across NVLink is ~1 us, an IB NIC-switch-NIC "
            "hop 1-2 us, plus the GPU's proxy and completion); override with --intra-alpha-us / "
            "--inter-alpha-us",
        ),
        references=(
            Reference("all_reduce", 8, 1, 370.0, "NCCL ring, 8x H100 (one node)",
                      "S. Jeaugey (NCCL), github.com/NVIDIA/nccl-tests/issues/212, 2024-05-06: busbw "
                      "~370 GB/s with NCCL_ALGO=RING; the model's intra bandwidth is this same figure, "
                      "so agreement at 8 ranks is by construction, not a check"),
            Reference("all_reduce", 8, 1, 480.0, "NCCL NVLS (NVLink SHARP), 8x H100",
                      "S. Jeaugey (NCCL), github.com/NVIDIA/nccl-tests/issues/212, 2024-05-06: 'On 8 "
                      "GPUs, you should reach a peak busBw of ~480GB/s' (NVLink SHARP reduces in the "
                      "switch: no ringcomm algorithm can match it); 476 GB/s called 'in the expected "
                      "range for H100' in github.com/NVIDIA/nccl-tests/issues/290"),
        ),
        no_reference="multi-node (16+ ranks): no published NCCL all_reduce busbw for DGX H100 nodes on "
                     "NDR found that we trust; NVIDIA states only the per-NIC 46-48 GB/s used above"),
    Preset(
        "dgx-a100-ib200", 8,
        {"intra": _link(2, 200, 0.2), "inter": _link(5, 24, 0.5), "gamma": 1 / 0.67e12, "nics": 8},
        "DGX A100 nodes (as Selene's, where Narayanan et al. 2021 ran Megatron-LM): 8 A100 80 GB per node "
        "over NVLink 3 / NVSwitch, nodes on 200 Gb/s HDR InfiniBand with one NIC per GPU (nics 8)",
        (
            "intra bandwidth 200 GB/s: NVLink 3 is 300 GB/s per direction per A100 (12 links, 600 GB/s "
            "bidirectional, NVIDIA A100 datasheet); nccl-tests all_reduce on 8x A100-SXM4-80GB reports "
            "busbw ~200 GB/s (github.com/NVIDIA/nccl-tests/issues/149, 2023-06-27) and 208 GB/s "
            "(github.com/NVIDIA/nccl-tests/issues/178, 2023-11-17)",
            "inter bandwidth 24 GB/s per NIC: HDR line rate 200 Gb/s = 25 GB/s; four HDR NICs for 8 "
            "A100s reached 84.8-96 GB/s busbw (github.com/NVIDIA/nccl-tests/issues/119, 2022-11-17), "
            "~24 GB/s per NIC",
            "nics 8: 'each node has eight NVIDIA Mellanox 200Gbps HDR Infiniband HCAs' (Narayanan et al. "
            "2021, sec. 5)",
            "gamma 0.67 TB/s: A100 80 GB HBM2e 2.0 TB/s (datasheet) over the 3 bytes moved per byte reduced",
            "alpha 2 us (NVLink) and 5 us (IB), overhead 0.2 / 0.5 us: our estimates, as for dgx-h100-ib400",
        ),
        references=(
            Reference("all_reduce", 8, 1, 200.0, "nccl-tests, 8x A100-SXM4-80GB (one node)",
                      "github.com/NVIDIA/nccl-tests/issues/149 (2023-06-27): busbw ~200 GB/s; the model's "
                      "intra bandwidth is this same figure, so agreement at 8 ranks is by construction"),
        ),
        no_reference="multi-node: the per-NIC 24 GB/s above is the only published figure used"),
]}


@dataclass
class Row:
    op: str
    hosts: int
    ranks_per_host: int
    size: int
    algos: Dict[str, Dict[str, float]] = field(default_factory=dict)  # name -> time_us, busbw_gbps
    pick: str = ""

    @property
    def world(self) -> int:
        return self.hosts * self.ranks_per_host

    def as_dict(self) -> dict:
        return {"op": self.op, "hosts": self.hosts, "ranks_per_host": self.ranks_per_host,
                "world_size": self.world, "size_bytes": self.size, "pick": self.pick, "algos": self.algos}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ringcomm-bench --simulate",
        description="Evaluate ringcomm's cost model for a described topology (no ranks are started): "
                    "every algorithm's predicted time and busbw per op, world size and size, the "
                    "pick (what auto runs) marked.",
        epilog="Presets: " + "; ".join(f"{n}: {p.description}" for n, p in PRESETS.items())
               + ". Sizes take K, M, G suffixes (binary).")
    a = p.add_argument
    a("--simulate", action="store_true", help=argparse.SUPPRESS)
    a("--preset", choices=sorted(PRESETS), help="a described machine: topology and sourced parameters")
    a("--hosts", help="comma list of host counts (default: 1, 2, 4, ... up to --max-ranks)")
    a("--ranks-per-host", help="comma list of ranks per host (default: the preset's)")
    a("--min-ranks", type=int, default=2, help="smallest world size of the default host list (default %(default)s)")
    a("--max-ranks", type=int, default=16384, help="largest world size (default %(default)s)")
    a("--params", metavar="FILE", help="parameters from a file ringcomm-bench --calibrate wrote "
                                       "(instead of the preset's)")
    for link in ("intra", "inter"):
        a(f"--{link}-alpha-us", type=float, help=f"{link}-host latency per message, us")
        a(f"--{link}-gbps", type=float, help=f"{link}-host bandwidth of one stream, GB/s")
        a(f"--{link}-overhead-us", type=float, help=f"{link}-host cost of issuing each further message, us")
    a("--gamma-gbps", type=float, help="reduction rate, GB/s")
    a("--nics", type=int, help="independent inter-host links per host (default: the preset's, else 1)")
    a("-b", "--minbytes", default="8", help="smallest size (default %(default)s)")
    a("-e", "--maxbytes", default="1G", help="largest size (default %(default)s)")
    a("-f", "--stepfactor", type=int, default=2, help="size multiplier (default %(default)s)")
    a("--ops", default="all_reduce", help="'all' or a comma list of " + ", ".join(OPS) + " (default %(default)s)")
    a("--plot-ranks", help="comma list of world sizes drawn as busbw against size (default: a few)")
    a("--json", metavar="FILE", help="write every row, the parameters and their sources to FILE")
    a("--plot", metavar="FILE.png", help="draw busbw against size and latency against ranks to FILE.png")
    return p


def _int_list(text: str, what: str) -> List[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be a comma list of integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{what} must list positive integers, got {text!r}")
    return list(dict.fromkeys(values))


def _positive(value: Optional[float], what: str) -> Optional[float]:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a positive number, got {value}")
    return value


def resolve(args: argparse.Namespace) -> dict:
    """The run's inputs from the options (ValueError says what is wrong)."""
    from ringcomm import cost_model

    preset = PRESETS[args.preset] if args.preset else None
    if preset is None and args.ranks_per_host is None:
        raise ValueError("describe a topology: --preset NAME, or --ranks-per-host (and --hosts)")
    per_host = _int_list(args.ranks_per_host, "--ranks-per-host") if args.ranks_per_host else \
        [preset.ranks_per_host]
    if args.max_ranks < 1 or args.min_ranks < 1 or args.min_ranks > args.max_ranks:
        raise ValueError(f"need 1 <= --min-ranks <= --max-ranks, got {args.min_ranks} and {args.max_ranks}")
    if args.max_ranks > 1 << 20:
        raise ValueError(f"--max-ranks {args.max_ranks} is beyond what the model is meant for (1,048,576)")
    topologies = []
    for rph in per_host:
        if args.hosts:
            hosts = _int_list(args.hosts, "--hosts")
        else:
            hosts, h = [], 1
            while h * rph <= args.max_ranks:
                if h * rph >= args.min_ranks:
                    hosts.append(h)
                h *= 2
        topologies += [(h, rph) for h in hosts if h * rph <= args.max_ranks]
    if not topologies:
        raise ValueError(f"no world size between --min-ranks {args.min_ranks} and --max-ranks "
                         f"{args.max_ranks} with {per_host} ranks per host")
    if any(h * r > 1 << 20 for h, r in topologies):
        raise ValueError("a world size above 1,048,576 ranks: the model is not meant for it")

    if args.params:
        params = cost_model.load(args.params)
        sources = [f"parameters from {args.params} ({params['source']})"]
    elif preset is not None:
        params = json.loads(json.dumps(preset.params))
        sources = list(preset.sources)
    else:
        params = cost_model.default_params()
        sources = ["ringcomm's default parameters (csrc/comm/cost_model.cpp default_cost_params)"]
    overridden = []
    for link in ("intra", "inter"):
        alpha = _positive(getattr(args, f"{link}_alpha_us"), f"--{link}-alpha-us")
        gbps = _positive(getattr(args, f"{link}_gbps"), f"--{link}-gbps")
        overhead = getattr(args, f"{link}_overhead_us")
        if overhead is not None and not (math.isfinite(overhead) and overhead >= 0):
            raise ValueError(f"--{link}-overhead-us must be >= 0, got {overhead}")
        if alpha is not None:
            params[link]["alpha"] = alpha / 1e6
            overridden.append(f"{link} alpha {alpha:g} us")
        if gbps is not None:
            params[link]["beta"] = 1 / (gbps * 1e9)
            overridden.append(f"{link} {gbps:g} GB/s")
        if overhead is not None:
            params[link]["overhead"] = overhead / 1e6
            overridden.append(f"{link} overhead {overhead:g} us")
    if _positive(args.gamma_gbps, "--gamma-gbps") is not None:
        params["gamma"] = 1 / (args.gamma_gbps * 1e9)
        overridden.append(f"gamma {args.gamma_gbps:g} GB/s")
    if args.nics is not None:
        params["nics"] = args.nics
        overridden.append(f"nics {args.nics}")
    if overridden:
        sources.append("given on the command line (replacing the above): " + ", ".join(overridden))
    params["source"] = args.preset or (f"file {args.params}" if args.params else "given")
    params = cost_model.check_params(params, "--simulate parameters")

    ops = list(OPS) if args.ops.strip().lower() == "all" else \
        list(dict.fromkeys(o.strip().lower().replace("-", "_") for o in args.ops.split(",") if o.strip()))
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ValueError(f"--ops: unknown {', '.join(bad) or 'nothing given'}; expected 'all' or some of "
                         + ", ".join(OPS))
    if args.stepfactor < 2:
        raise ValueError(f"-f must be >= 2 (sizes grow geometrically), got {args.stepfactor}")
    sizes = size_list(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    worlds = sorted({h * r for h, r in topologies})
    if args.plot_ranks:
        plot_ranks = _int_list(args.plot_ranks, "--plot-ranks")
        missing = [w for w in plot_ranks if w not in worlds]
        if missing:
            raise ValueError(f"--plot-ranks {missing} not among the simulated world sizes {worlds}")
    else:
        plot_ranks = _default_plot_ranks(topologies)
    # The references describe the machine, not the model: shown whatever the parameters.
    refs = list(preset.references) if preset else []
    return {"preset": preset, "topologies": topologies, "params": params, "sources": sources,
            "ops": ops, "sizes": sizes, "plot_ranks": plot_ranks, "references": refs,
            "no_reference": preset.no_reference if preset else
            "no preset: no published figures to compare with"}


def _default_plot_ranks(topologies) -> List[int]:
    """The smallest world, the first spanning hosts, one in the middle, the largest."""
    worlds = sorted({h * r for h, r in topologies})
    multi = sorted({h * r for h, r in topologies if h > 1})
    picks = [worlds[0]]
    if multi:
        picks.append(multi[0])
    picks.append(worlds[len(worlds) // 2])
    picks.append(worlds[-1])
    return sorted(set(picks))


def simulate(inputs: dict) -> List[Row]:
    from ringcomm import cost_model

    rows = []
    for hosts, rph in inputs["topologies"]:
        model = cost_model.model(hosts, rph, inputs["params"])
        n = hosts * rph
        for op in inputs["ops"]:
            coll = COLLECTIVES[op]
            for size in inputs["sizes"]:
                if coll.per_rank_share and size < n * _ITEMSIZE:
                    continue
                row = Row(op, hosts, rph, size)
                predicted = model.predict(op, size)
                for name, secs in predicted:
                    busbw = size / secs * coll.factor(n) / 1e9 if secs > 0 else float("inf")
                    row.algos[name] = {"time_us": _sig(secs * 1e6), "busbw_gbps": _sig(busbw)}
                row.pick = predicted[0][0]  # predict() is fastest first: the pick
                rows.append(row)
    return rows


def _sig(x: float) -> float:
    """Six significant digits: the model is not more exact than that, the JSON is smaller."""
    return float(f"{x:.6g}")


def _fmt_time(us: float) -> str:
    return f"{us:.3g}" if us < 1000 else f"{us:.0f}"


def _fmt_bw(gbps: float) -> str:
    return f"{gbps:.3g}" if gbps < 100 else f"{gbps:.0f}"


def header_lines(inputs: dict, command: str) -> List[str]:
    p, preset = inputs["params"], inputs["preset"]
    worlds = sorted({h * r for h, r in inputs["topologies"]})
    lines = [f"# {command}",
             "# ringcomm-bench --simulate: the cost model's predictions (csrc/comm/cost_model.cpp), "
             "no ranks started; busbw with nccl-tests' factors",
             f"#  topology: {preset.description if preset else 'as given'}; world sizes "
             f"{worlds[0]} .. {worlds[-1]} ({len(worlds)})"]
    for link in ("intra", "inter"):
        l = p[link]
        lines.append(f"#  {link}: alpha {l['alpha'] * 1e6:.3g} us, {1 / l['beta'] / 1e9:.4g} GB/s per stream, "
                     f"overhead {l['overhead'] * 1e6:.3g} us per further message")
    lines.append(f"#  reduction {1 / p['gamma'] / 1e9:.4g} GB/s; nics {p['nics']} inter-host link(s) per host")
    lines.append("#  where the figures come from:")
    lines += [f"#   - {s}" for s in inputs["sources"]]
    if inputs["references"]:
        lines.append("#  published reference points (shown beside the prediction, not used by it):")
        lines += [f"#   - {r.op} {r.hosts * r.ranks_per_host} ranks: {r.label}: busbw ~{r.busbw_gbps:g} GB/s "
                  f"at >= {format_size(r.min_size)}; {r.source}" for r in inputs["references"]]
    if inputs["no_reference"]:
        lines.append(f"#  {inputs['no_reference']}")
    lines.append(f"#  sizes {format_size(inputs['sizes'][0])} .. {format_size(inputs['sizes'][-1])}; per-rank-"
                 f"share ops skip sizes below one float per rank; time in us, busbw in GB/s; * = the pick")
    return lines


def table_lines(rows: List[Row], inputs: dict) -> List[str]:
    out: List[str] = []
    for op in inputs["ops"]:
        for hosts, rph in inputs["topologies"]:
            block = [r for r in rows if r.op == op and r.hosts == hosts and r.ranks_per_host == rph]
            if not block:
                continue
            names = list(dict.fromkeys(n for r in block for n in r.algos))
            n = hosts * rph
            out.append("")
            out.append(f"# {op}: {n} ranks = {hosts} host(s) x {rph}")
            out.append(f"#{'size':>10}  " + "".join(f"{name[:19]:>20}" for name in names) + "  pick")
            out.append(f"#{'(B)':>10}  " + "".join(f"{'time  busbw':>20}" for _ in names))
            for r in block:
                cells = []
                for name in names:
                    c = r.algos.get(name)
                    if c is None:
                        cells.append(f"{'-':>20}")
                        continue
                    mark = "*" if name == r.pick else " "
                    cells.append(f"{_fmt_time(c['time_us']):>11} {_fmt_bw(c['busbw_gbps']):>7}{mark}")
                out.append(f"{r.size:>11}  " + "".join(cells) + f"  {r.pick}")
            for ref in inputs["references"]:
                if ref.op == op and ref.hosts == hosts and ref.ranks_per_host == rph:
                    big = [r for r in block if r.size >= ref.min_size]
                    pred = (f"; predicted pick at {format_size(big[-1].size)}: {big[-1].pick} "
                            f"{big[-1].algos[big[-1].pick]['busbw_gbps']:.0f} GB/s") if big else ""
                    out.append(f"#  reference: {ref.label}: ~{ref.busbw_gbps:g} GB/s busbw{pred} "
                               f"(source: {ref.source.split(':')[0]})")
    return out


def write_json(path: str, rows: List[Row], inputs: dict, command: str) -> None:
    doc = {
        "format": FORMAT,
        "command": command,
        "preset": inputs["preset"].name if inputs["preset"] else None,
        "description": inputs["preset"].description if inputs["preset"] else None,
        "params": inputs["params"],
        "sources": inputs["sources"],
        "references": [{**asdict(r), "world_size": r.hosts * r.ranks_per_host} for r in inputs["references"]],
        "no_reference": inputs["no_reference"],
        "topologies": [{"hosts": h, "ranks_per_host": r, "world_size": h * r} for h, r in inputs["topologies"]],
        "ops": inputs["ops"],
        "sizes": inputs["sizes"],
        "units": {"time_us": "predicted seconds x 1e6", "busbw_gbps": "size / time x nccl-tests factor / 1e9"},
        "rows": [r.as_dict() for r in rows],
    }
    # One row per line: readable with grep and diff, a third of an indented file.
    rows_text = ",\n".join(json.dumps(r, separators=(",", ":")) for r in doc.pop("rows"))
    head = json.dumps(doc, indent=1)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(head[:-2] + ',\n "rows": [\n' + rows_text + "\n ]\n}\n")
    os.replace(tmp, path)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        inputs = resolve(args)
    except ValueError as e:
        parser.error(str(e))
    command = shlex.join(["ringcomm-bench", "--simulate", *(a for a in argv if a != "--simulate")])
    rows = simulate(inputs)
    out = sys.stdout
    for line in header_lines(inputs, command) + table_lines(rows, inputs):
        out.write(line + "\n")
    out.flush()
    if args.json:
        write_json(args.json, rows, inputs, command)
        print(f"ringcomm-bench: wrote {args.json}", file=sys.stderr)
    if args.plot:
        from ringcomm.bench.simulate_plot import plot_simulation

        plot_simulation(rows, inputs, args.plot)
        print(f"ringcomm-bench: wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
