"""ringcomm against the best CPU peer, from ringcomm-bench JSON reports.

Each report is one job (one MPI's launcher; ringcomm, gloo, that MPI and
DeepSpeed taking turns size by size). For every (op, world size, dtype,
size) the table gives each peer's time, ringcomm's time in the same job as
that peer (the median over the jobs, or launches, that ran it), and
ringcomm's ratio to the best peer: ringcomm's time over the peer's, each
from the same job, so that drift between jobs does not enter a ratio
(<= 1.00: ringcomm at least as fast). Also all_reduce busbw against the same
job's memcpy.

    python benchmarks/peers/summarize.py benchmarks/results/peers/*.json > benchmarks/results/peers_table.txt

--markdown SIZES prints the README's tables (a ratio per op, world size, dtype
and size; all_reduce's times per backend) from the same reports instead.
"""
import argparse
import collections
import json
import statistics
import sys


def peer_name(report, backend):
    """The peer's name in the table: the MPI's library for "mpi"."""
    if backend == "mpi":
        lib = report["machine"].get("mpi_library") or "mpi"
        for key, short in (("Open MPI", "openmpi"), ("MPICH", "mpich"), ("Intel", "intelmpi")):
            if key in lib:
                return short
        return lib
    return backend


def fmt_size(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def collect(paths):
    """(op, world, dtype, size) -> peer -> [(peer us, ringcomm us)], and memcpy / busbw rows."""
    pairs = collections.defaultdict(lambda: collections.defaultdict(list))
    # (world, dtype, size) -> [(ringcomm busbw, memcpy GB/s, memcpy_n GB/s: every rank at once)]
    busbw = collections.defaultdict(list)
    meta = []
    for path in paths:
        with open(path) as f:
            rep = json.load(f)
        world = rep["config"]["world_size"]
        meta.append((path, rep["date"], rep["machine"].get("cpu_model"), world, rep["config"]["dtype"],
                     rep["machine"].get("mpi_library") or "-", " ".join(rep.get("command", []))))
        for row in rep["results"]:
            cells = row["backends"]
            ring = cells.get("ringcomm", {})
            if "time_us" not in ring:
                continue
            key = (row["op"], world, row["type"], row["size_bytes"])
            for b, cell in cells.items():
                if b == "ringcomm" or "time_us" not in cell or cell.get("wrong", 0):
                    continue
                pairs[key][peer_name(rep, b)].append((cell["time_us"], ring["time_us"]))
            if row["op"] == "all_reduce" and (row.get("memcpy") or {}).get("gbps"):
                every = (row.get("memcpy_all") or {}).get("gbps") or float("nan")
                busbw[(world, row["type"], row["size_bytes"])].append(
                    (ring["busbw_gbps"], row["memcpy"]["gbps"], every))
    return pairs, busbw, meta


def cell_stats(cells):
    """peer -> [(peer us, ringcomm us)] -> (median per peer, ratio per peer, best peer, ringcomm's us in its jobs)."""
    med = {p: statistics.median(t for t, _ in v) for p, v in cells.items()}
    ratio = {p: statistics.median(r / t for t, r in v) for p, v in cells.items()}
    best = min(med, key=med.get)
    ring = statistics.median(r for _, r in cells[best])
    return med, ratio, best, ring


SHORT = {"openmpi": "OMPI", "mpich": "MPICH", "intelmpi": "IMPI", "deepspeed": "DS", "gloo": "gloo"}
DTYPE = {"float": "fp32", "bfloat16": "bf16"}


def fmt_bytes(n):
    for unit, k in ((" MiB", 1 << 20), (" KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return f"{n} B"


def markdown(pairs, busbw, meta, sizes):
    """The README's tables, every figure from these reports: ringcomm's time / the best peer's at each of
    `sizes` per (op, world, dtype), and all_reduce's time per backend at the smallest world and float32."""
    out = []
    cpus = sorted({m[2] or "?" for m in meta})
    dates = sorted(m[1] for m in meta)
    mpis = sorted({m[5] for m in meta if m[5] != "-"})
    out.append(f"{', '.join(cpus)}; {len(meta)} jobs, {dates[0][:16]} to {dates[-1][:16]} UTC; "
               f"MPIs: {'; '.join(' '.join(x.split()) for x in mpis)}.")
    out.append("")
    out.append("ringcomm's time / the best peer's, both from the same job (median over the jobs), and that peer "
               "(OMPI Open MPI, IMPI Intel MPI, MPICH, DS DeepSpeed's shm all_reduce, gloo); below 1.00 ringcomm "
               "is faster:")
    out.append("")
    out.append("| op | ranks | dtype | " + " | ".join(fmt_bytes(n) for n in sizes) + " |")
    out.append("|---|---|---|" + "---|" * len(sizes))
    groups = sorted({k[:3] for k in pairs}, key=lambda g: (g[1], g[0], g[2] != "float"))
    for op, world, dtype in groups:
        row = f"| {op} | {world} | {DTYPE.get(dtype, dtype)} |"
        for n in sizes:
            cells = pairs.get((op, world, dtype, n))
            if not cells:
                row += " - |"
                continue
            _, ratio, best, _ = cell_stats(cells)
            mark = "**" if ratio[best] > 1.0 else ""
            r = ratio[best]
            row += f" {mark}{r:.2f}{mark} {SHORT.get(best, best)} |" if r >= 0.1 else f" {r:.3f} {SHORT.get(best, best)} |"
        out.append(row)
    worlds = sorted({k[1] for k in pairs})
    if worlds:
        world = worlds[0]
        keys = sorted((k for k in pairs if k[:3] == ("all_reduce", world, "float") and k[3] in sizes),
                      key=lambda k: k[3])
        peers = sorted({p for k in keys for p in pairs[k]})
        out.append("")
        out.append(f"all_reduce, {world} ranks, fp32 SUM, time per call in us (each peer's median over its jobs; "
                   "ringcomm's in the best peer's jobs); busbw against the same jobs' memcpy:")
        out.append("")
        out.append("| size | ringcomm | " + " | ".join(peers) + " | ringcomm busbw / memcpy, memcpy on every rank |")
        out.append("|---|---|" + "---|" * len(peers) + "---|")
        for k in keys:
            med, _, _, ring = cell_stats(pairs[k])
            bw = busbw.get((world, "float", k[3]))
            frac = "-"
            if bw and k[3] >= (1 << 20):
                frac = (f"{statistics.median(x for x, _, _ in bw):.2f} GB/s: "
                        f"{statistics.median(x / y for x, y, _ in bw):.2f}x, "
                        f"{statistics.median(x / z for x, _, z in bw):.2f}x")
            out.append(f"| {fmt_bytes(k[3])} | {ring:.2f} | " + " | ".join(
                f"{med[p]:.2f}" if p in med else "-" for p in peers) + f" | {frac} |")
    return "\n".join(out)


def parse_sizes(text):
    out = []
    for part in text.split(","):
        part = part.strip().upper()
        mult = 1
        if part.endswith("M"):
            mult, part = 1 << 20, part[:-1]
        elif part.endswith("K"):
            mult, part = 1 << 10, part[:-1]
        out.append(int(part) * mult)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+")
    p.add_argument("--markdown", metavar="SIZES", type=parse_sizes,
                   help="print the README's markdown tables at these sizes instead (4,1K,64K,1M,16M,64M,256M)")
    a = p.parse_args(argv)
    pairs, busbw, meta = collect(a.reports)
    if a.markdown:
        print(markdown(pairs, busbw, meta, a.markdown))
        return 0
    print("# ringcomm against each CPU peer, time per call (us, median over the jobs that ran it); best = the peer")
    print("# with the lowest time; ringcomm us = ringcomm's median in the best peer's jobs; ratio = ringcomm's time /")
    print("# the best peer's, both from the same job (median over jobs): <= 1.00, ringcomm at least as fast. Reports:")
    for m in meta:
        print(f"#   {m[0]}: {m[1]}, {m[2]}, world {m[3]}, {m[4]}, MPI {m[5]}")
    print(f"#   command of the first: {meta[0][6]}" if meta else "#   (none)")
    peers = sorted({p for d in pairs.values() for p in d})
    groups = collections.defaultdict(list)
    for key in pairs:
        groups[key[:3]].append(key)
    behind = []
    for gkey in sorted(groups):
        op, world, dtype = gkey
        print(f"\n## {op}, world {world}, {dtype}")
        head = f"{'size':>6} " + "".join(f"{p + ' us':>13}" for p in peers) + f"{'ringcomm us':>13} {'best peer':>10} {'ratio':>6}"
        print(head)
        for key in sorted(groups[gkey], key=lambda k: k[3]):
            d = pairs[key]
            med, ratio, best, ring = cell_stats(d)  # ring: ringcomm's median in the best peer's jobs
            worst_ratio = max(ratio[p] for p in ratio)
            line = f"{fmt_size(key[3]):>6} " + "".join(
                f"{med[p]:13.2f}" if p in med else f"{'-':>13}" for p in peers)
            line += f"{ring:13.2f} {best:>10} {ratio[best]:6.2f}"
            print(line)
            if worst_ratio > 1.0:
                who = max(ratio, key=ratio.get)
                behind.append((op, world, dtype, key[3], who, ratio[who]))
    print("\n## all_reduce busbw against the same job's memcpy (rank 0 alone) and memcpy_n (every rank at once)")
    print(f"{'world':>5} {'dtype':>9} {'size':>6} {'busbw GB/s':>11} {'memcpy GB/s':>12} {'ratio':>6}"
          f" {'memcpy_n GB/s':>14} {'ratio':>6}")
    for (world, dtype, size), v in sorted(busbw.items()):
        if size < (1 << 20):
            continue
        bw = statistics.median(x for x, _, _ in v)
        mc = statistics.median(y for _, y, _ in v)
        mn = statistics.median(z for _, _, z in v)
        r = statistics.median(x / y for x, y, _ in v)
        rn = statistics.median(x / z for x, _, z in v)
        print(f"{world:5d} {dtype:>9} {fmt_size(size):>6} {bw:11.2f} {mc:12.2f} {r:6.2f} {mn:14.2f} {rn:6.2f}")
    print(f"\n## where a peer is faster than ringcomm (ratio > 1.00): {len(behind)} cells")
    for op, world, dtype, size, who, r in behind:
        print(f"  {op:15s} world {world} {dtype:9s} {fmt_size(size):>6}: {who} ({r:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
