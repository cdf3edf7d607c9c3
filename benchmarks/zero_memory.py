"""Per-rank model-state memory of ZeroDataParallel against the ZeRO paper's accounting.

    python benchmarks/zero_memory.py            # measured at N = 2 and 4, the paper's N = 64

Model: 8 x Linear(256, 256) (P = 526,336), bf16 mixed precision, Adam (K = 12: fp32
master, momentum, variance), measured with memory_bytes() after two steps: bytes held
in the tensors each rank keeps between steps. Replicated is stage 1 on a one-rank
communicator. The paper's formulas: replicated (2+2+K)P, stage 1 2P + 2P + KP/N,
stage 2 2P + (2+K)P/N, stage 3 (2+2+K)P/N. Between steps no bucket or gathered copy is
held (the buffers column); the padding of each unit to a multiple of N is counted.
peak_buffers: the most bytes of buckets, reduce outputs and gathered copies alive at once
during the steps (stages 2 and 3; buckets of 0.25 MiB, two layers each).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_bench import run  # noqa: E402

LABELS = ("replicated", "stage 1", "stage 2", "stage 3")


def _rank(comm):
    import torch
    import torch.nn as nn

    from ringcomm.parallel import ZeroDataParallel

    x = torch.randn(4, 256)

    def measure(c, stage):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
        z = ZeroDataParallel(model, c, stage=stage, optimizer_class=torch.optim.Adam,
                             mixed_precision="bf16", bucket_cap_mb=0.25, lr=1e-3)
        for _ in range(2):
            z(x).float().square().mean().backward()
            z.step()
            z.zero_grad()
        return z.memory_bytes()

    solo = None
    for r in range(comm.world_size):
        sub = comm.split(ranks=[r])
        if sub is not None:
            solo = sub
    out = {"replicated": measure(solo, 1)}
    solo.close()
    for stage in (1, 2, 3):
        out[f"stage {stage}"] = measure(comm, stage)
    return out


def main():
    from ringcomm.parallel import paper_memory_bytes

    P = 8 * (256 * 256 + 256)
    print(f"# P = {P:,} parameters, bf16 + fp32 Adam (K = 12); bytes per rank (rank 0), "
          f"measured / paper formula")
    measured = {n: run(_rank, n)[0] for n in (2, 4)}
    head = "".join(f" {f'N={n} measured':>16s} {f'N={n} paper':>12s} {'diff':>6s}" for n in (2, 4))
    print(f"  {'':<12s}{head} {'N=64 paper':>12s} {'N=64 MB at 7.5B':>15s}")
    for stage, label in enumerate(LABELS):
        cells = ""
        for n in (2, 4):
            got = measured[n][label]["total"]
            want = sum(paper_memory_bytes(P, n, stage))
            cells += f" {got:16,d} {want:12,.0f} {100 * (got - want) / want:5.1f}%"
        n64 = sum(paper_memory_bytes(P, 64, stage))
        big = sum(paper_memory_bytes(7.5e9, 64, stage)) / 1e9
        print(f"  {label:<12s}{cells} {n64:12,.0f} {big:12.2f} GB")
    for n in (2, 4):
        for label in LABELS:
            m = measured[n][label]
            print(f"  N={n} {label:<10s} params {m['params']:,} grads {m['grads']:,} "
                  f"optimizer_state {m['optimizer_state']:,} buffers {m['buffers']:,} "
                  f"(peak during a step {m['peak_buffers']:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
