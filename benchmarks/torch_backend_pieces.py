"""Where a blocking 4-byte dist.all_reduce spends its time in the "ringcomm"
group's Python code: each piece of the group's fast path timed alone, in one
process (a group of one rank, so the native call does no communication),
beside torch's floor (a Python ProcessGroup that does nothing) and the whole
call. Each figure is the best of 9 rounds of --calls calls (us per call).

    python benchmarks/torch_backend_pieces.py [--calls 20000]
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import ringcomm.torch_backend  # noqa: E402,F401  (registers the backend)
from ringcomm.bench.report import _cpu_model  # noqa: E402
from ringcomm.torch_backend import process_group as pg_mod  # noqa: E402
from ringcomm.torch_backend.work import CompletedWork, RingcommWork  # noqa: E402
from torch_overhead import _register_noop_backend  # noqa: E402


def best_us(f, calls):
    best = float("inf")
    for _ in range(9):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    _register_noop_backend()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True)
    dist.init_process_group("ringcomm", store=store, rank=0, world_size=1)
    noop = dist.new_group([0], backend="noop")
    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    t = torch.zeros(1)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    r = opts.reduceOp
    native = pg.communicator._native

    class BareWork(dist._Work):
        def wait(self, timeout=None):
            return True

    rows = [
        ("dist.all_reduce on ringcomm (the whole call)", lambda: dist.all_reduce(t)),
        ("dist.all_reduce on the no-op group (floor)", lambda: dist.all_reduce(t, group=noop)),
        ("group.allreduce([t], opts) called directly", lambda: pg.allreduce([t], opts)),
        ("  _fast_tensor([t])", lambda: pg._fast_tensor([t])),
        ("  opts.reduceOp", lambda: opts.reduceOp),
        ("  reduceOp == SUM", lambda: r == pg_mod._TORCH_SUM),
        ("  opts.asyncOp", lambda: opts.asyncOp),
        ("  the native all_reduce", lambda: native.all_reduce(t, 0, False)),
        ("  CompletedWork([t]) (the blocking call's Work)", lambda: CompletedWork([t])),
        ("  RingcommWork((), [t]) (the general Work)", lambda: RingcommWork((), [t])),
        ("  a bare Python Work (the floor's)", BareWork),
    ]
    print(f"# {_cpu_model()}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; "
          f"best of 9 rounds x {a.calls} calls, us per call")
    print(f"# command: python benchmarks/torch_backend_pieces.py --calls {a.calls}")
    for name, f in rows:
        print(f"{name:<50}{best_us(f, a.calls):8.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
