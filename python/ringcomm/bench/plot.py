"""busbw and latency against message size, from a sweep report (matplotlib, Agg).

One row of two log-log panels per primitive: bus bandwidth (left) and time per call
(right), one line per backend, and the memcpy reference of the same run as a dashed
line (its bandwidth on the left, its time for the same bytes on the right).
"""

from __future__ import annotations

from typing import Dict


def plot_report(report: Dict[str, object], path: str) -> None:
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib, or the "
                           "'bench' extra of ringcomm)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    size_label = FuncFormatter(lambda x, _: _short_size(x))

    results = report["results"]
    ops = list(dict.fromkeys(r["op"] for r in results))
    backends = list(report["backends"])
    if not ops:
        raise ValueError("the report has no results to plot")
    fig, axes = plt.subplots(len(ops), 2, figsize=(11, 3.6 * len(ops)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    world = report["config"].get("world_size")
    for row_axes, op in zip(axes, ops):
        rows = [r for r in results if r["op"] == op]
        bw_ax, t_ax = row_axes
        for i, b in enumerate(backends):
            pts = [(r["size_bytes"], r["backends"][b]) for r in rows
                   if b in r["backends"] and "busbw_gbps" in r["backends"][b]]
            if not pts:
                continue
            sizes = [s for s, _ in pts]
            color = colors[i % len(colors)]
            bw_ax.plot(sizes, [c["busbw_gbps"] for _, c in pts], "o-", ms=3, color=color,
                       label=b)
            t_ax.plot(sizes, [c["time_us"] for _, c in pts], "o-", ms=3, color=color,
                      label=b)
        for key, style, label in (("memcpy", "--", "memcpy (1 thread)"),
                                  ("memcpy_all", ":", "memcpy (every rank at once)")):
            ref = [(r["size_bytes"], r[key]) for r in rows if r.get(key)]
            if ref:
                sizes = [s for s, _ in ref]
                bw_ax.plot(sizes, [m["gbps"] for _, m in ref], style, color="gray", label=label)
                t_ax.plot(sizes, [m["time_us"] for _, m in ref], style, color="gray", label=label)
        for ax, ylabel in ((bw_ax, "busbw (GB/s)"), (t_ax, "time (us)")):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(LogLocator(base=4))
            ax.xaxis.set_major_formatter(size_label)
            ax.set_yscale("log")
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        bw_ax.set_title(f"{op}: bus bandwidth (world size {world})")
        t_ax.set_title(f"{op}: time per call (median of slowest rank)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _short_size(x: float) -> str:
    """Tick label: 8, 1K, 64M (binary units)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if x >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"
