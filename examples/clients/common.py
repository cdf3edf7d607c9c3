"""What the client examples share: the model, the data, the arguments and the result files.

Every example trains the same MLP from the same initialisation on the same
per-rank batches, so that two runs that differ only in the process-group
backend (ringcomm, gloo) must end with the same losses and parameters. Each
rank writes OUT/rank{r}.json (losses, step times, the backend torch used)
and OUT/rank{r}.pt (the final, full parameters).
"""
import argparse
import json
import os
import time

import torch

IN, OUT = 16, 4


def mlp(width, seed=7):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, OUT))


def batch(step, rank, n=32):
    """Rank `rank`'s batch at `step`: the same for every backend and launcher."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, IN, generator=g), torch.randn(n, OUT, generator=g)


def parser(description, variants):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--backend", default="ringcomm", help="torch.distributed backend (ringcomm, gloo)")
    ap.add_argument("--variant", default=variants[0], choices=variants)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--width", type=int, default=32, help="hidden width of the MLP")
    ap.add_argument("--out", required=True, help="folder for rank{r}.json and rank{r}.pt")
    return ap


class StepTimer:
    """Wall time of each training step (start() .. stop())."""

    def __init__(self):
        self.times, self._t0 = [], None

    def start(self):
        self._t0 = time.perf_counter()

    def stop(self):
        self.times.append(time.perf_counter() - self._t0)


def write(out, rank, *, backend, losses, params, step_times, **extra):
    """Writes this rank's results; `backend` is what torch.distributed reports it ran on."""
    os.makedirs(out, exist_ok=True)
    torch.save([p.detach().cpu().clone() for p in params], os.path.join(out, f"rank{rank}.pt"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(dict(backend=backend, losses=[float(v) for v in losses], step_times=step_times, **extra), f)
