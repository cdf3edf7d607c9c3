"""The --simulate plot (matplotlib, Agg): per op one row of panels.

- one panel per plotted world size: predicted busbw against size, one line per
  algorithm, the pick (what `auto` runs) traced over them as black dots, and
  the published reference points of that world size as dashed segments over
  the sizes they apply to;
- a last panel: predicted latency (time of the smallest size) against the
  number of ranks, one line per algorithm, the pick as black dots.
"""

from __future__ import annotations

from typing import List


def plot_simulation(rows: List, inputs: dict, path: str) -> None:
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib, or the "
                           "'bench' extra of ringcomm)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    from ringcomm.bench.plot import _short_size

    ops = [op for op in inputs["ops"] if any(r.op == op for r in rows)]
    worlds = inputs["plot_ranks"]
    if not ops:
        raise ValueError("nothing to plot: no rows")
    ncols = len(worlds) + 1
    fig, axes = plt.subplots(len(ops), ncols, figsize=(4.2 * ncols, 3.6 * len(ops)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    every = list(dict.fromkeys(n for r in rows for n in r.algos))
    color_of = {n: colors[i % len(colors)] for i, n in enumerate(every)}
    title = inputs["preset"].name if inputs["preset"] else "given topology"

    for row_axes, op in zip(axes, ops):
        mine = [r for r in rows if r.op == op]
        for ax, world in zip(row_axes, worlds):
            block = [r for r in mine if r.world == world]
            for name in dict.fromkeys(n for r in block for n in r.algos):
                pts = [(r.size, r.algos[name]["busbw_gbps"]) for r in block if name in r.algos]
                ax.plot([s for s, _ in pts], [b for _, b in pts], "-", lw=1.2, color=color_of[name], label=name)
            ax.plot([r.size for r in block], [r.algos[r.pick]["busbw_gbps"] for r in block], "o", ms=3.5,
                    color="black", label="pick (auto)")
            for ref in inputs["references"]:
                if ref.op == op and ref.hosts * ref.ranks_per_host == world:
                    hi = inputs["sizes"][-1]
                    lo = min(ref.min_size, hi)
                    ax.plot([lo, hi], [ref.busbw_gbps] * 2, "--", lw=2, label=f"published: {ref.label}")
            hosts = sorted({r.hosts for r in block})
            ax.set_title(f"{op}, {world} ranks ({'/'.join(map(str, hosts))} host(s)): busbw", fontsize=9)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(LogLocator(base=16))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _short_size(x)))
            ax.set_yscale("log")
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel("predicted busbw (GB/s)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6)
        ax = row_axes[-1]
        # The smallest size of each world size: 8 B, or one float per rank for
        # the per-rank-share ops (their smaller sizes are skipped).
        first = {}
        for r in mine:
            if r.world not in first or r.size < first[r.world].size:
                first[r.world] = r
        small = [first[w] for w in sorted(first)]
        for name in dict.fromkeys(n for r in small for n in r.algos):
            pts = [(r.world, r.algos[name]["time_us"]) for r in small if name in r.algos]
            ax.plot([w for w, _ in pts], [t for _, t in pts], "-", lw=1.2, color=color_of[name], label=name)
        ax.plot([r.world for r in small], [r.algos[r.pick]["time_us"] for r in small], "o", ms=3.5,
                color="black", label="pick (auto)")
        sizes = sorted({r.size for r in small})
        what = f"{sizes[0]} B" if len(sizes) == 1 else f"{sizes[0]} B, or 4 B per rank"
        ax.set_title(f"{op}: latency ({what}) against ranks", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_ylabel("predicted time (us)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"ringcomm cost model, {title}: predictions, not measurements", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.975))
    fig.savefig(path, dpi=72)
    plt.close(fig)
