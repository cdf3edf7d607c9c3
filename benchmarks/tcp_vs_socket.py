"""ringcomm over TCP against a plain socket and gloo, from ringcomm-bench --socket reports.

Each report is one run in which ringcomm (transport tcp), gloo and the raw socket
exchange (bench/socket_ref.py) took turns size by size; per (op, size) this prints
each run's figures and the median over runs of ringcomm's ratio to the socket
(busbw / socket GB/s; at 8 B: socket time / ringcomm time) and to gloo.

    python benchmarks/tcp_vs_socket.py benchmarks/results/tcp_loopback_*.json
    python benchmarks/tcp_vs_socket.py benchmarks/results/tcp_veth_2hosts.json   (multihost.py's OUT.json: its runs)
"""
import argparse
import collections
import json
import statistics
import sys


def reports(paths, multihost):
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        # multihost.py's OUT.json holds its runs' reports; --multihost only insists on that form.
        if multihost or str(data.get("schema", "")).startswith("ringcomm-multihost"):
            if "runs" not in data and "reports" not in data:
                raise SystemExit(f"{path}: not a multihost.py report (no 'runs')")
            for run in data.get("runs", data.get("reports", [])):
                yield path, run.get("report", run)
        else:
            yield path, data


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+")
    p.add_argument("--multihost", action="store_true", help="multihost.py OUT.json files (their runs' reports)")
    a = p.parse_args(argv)
    rows = collections.defaultdict(list)
    for path, rep in reports(a.reports, a.multihost):
        ring_name = next((b for b in rep["backends"] if b.startswith("ringcomm")), "ringcomm")
        for r in rep["results"]:
            sock = r.get("socket")
            ring = r["backends"].get(ring_name, {})
            gloo = r["backends"].get("gloo", {})
            if not sock or "time_us" not in ring:
                continue
            rows[(r["op"], r["size_bytes"])].append((ring, gloo, sock, rep["machine"].get("cpu_model")))
    print("# ringcomm over TCP vs a plain TCP socket exchange (ranks 0 and 1, same link) and gloo; per run:")
    print("# time us / busbw GB/s; ratio = ringcomm busbw / socket GB/s (time ratio socket/ringcomm below 64 KiB)")
    cpu = next((v[0][3] for v in rows.values()), "?")
    print(f"# CPU: {cpu}; reports: {', '.join(a.reports)}")
    print(f"{'op':9s} {'size':>9s} {'ringcomm us':>12s} {'gloo us':>9s} {'socket us':>10s} {'ring GB/s':>10s}"
          f" {'socket GB/s':>12s} {'vs socket':>10s} {'vs gloo':>8s}")
    for (op, size), v in sorted(rows.items()):
        rt = statistics.median(x[0]["time_us"] for x in v)
        gt = statistics.median(x[1]["time_us"] for x in v if "time_us" in x[1]) if any(
            "time_us" in x[1] for x in v) else float("nan")
        st = statistics.median(x[2]["time_us"] for x in v)
        rb = statistics.median(x[0]["busbw_gbps"] for x in v)
        sb = statistics.median(x[2]["gbps"] for x in v)
        small = size < 65536
        vs_sock = statistics.median((x[2]["time_us"] / x[0]["time_us"]) if small else
                                    (x[0]["busbw_gbps"] / x[2]["gbps"]) for x in v)
        vs_gloo = statistics.median(x[1]["time_us"] / x[0]["time_us"] for x in v if "time_us" in x[1]) \
            if any("time_us" in x[1] for x in v) else float("nan")
        print(f"{op:9s} {size:9d} {rt:12.1f} {gt:9.1f} {st:10.1f} {rb:10.2f} {sb:12.2f} {vs_sock:10.2f} {vs_gloo:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
