"""What the fault checks cost in small-message latency, measured side by side.

Each rank opens two communicators over the same ranks, one with the agreement
exchange of rooted calls (the default) and one without it (RINGCOMM_CHECK_AGREEMENT=0),
and times the same calls on both in alternating blocks, so drift on this shared
machine hits both alike. all_reduce and all_gather are controls (they have no
agreement exchange): their ratio shows the noise floor.

    python benchmarks/fault_checks_cost.py [--nproc 2] [--iters 2000] [--blocks 15]

Prints, per op and size: the median over blocks of the per-call time on each
communicator (slowest rank), and their ratio. Run it alone (no other load).
"""
import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = [("broadcast", 8), ("broadcast", 4096), ("reduce", 8), ("scatter", 8), ("gather", 8),
         ("all_reduce", 8), ("all_gather", 8)]


def run_case(comm, op, nbytes, iters):
    import numpy as np

    n = max(1, nbytes // 4)
    ws = comm.world_size
    x = np.ones(n, np.float32)
    big = np.ones(n * ws, np.float32)
    if op == "broadcast":
        call = lambda: comm.broadcast(x, src=0)  # noqa: E731
    elif op == "reduce":
        call = lambda: comm.reduce(x, dst=0)  # noqa: E731
    elif op == "scatter":
        call = lambda: comm.scatter(x, big if comm.rank == 0 else None, src=0)  # noqa: E731
    elif op == "gather":
        call = lambda: comm.gather(big if comm.rank == 0 else None, x, dst=0)  # noqa: E731
    elif op == "all_reduce":
        call = lambda: comm.all_reduce(x)  # noqa: E731
    else:
        call = lambda: comm.all_gather(big, x)  # noqa: E731
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def rank_main(rank, nproc, port, iters, blocks, q):
    import torch.distributed as dist

    import ringcomm

    store = dist.TCPStore("127.0.0.1", port, nproc, is_master=rank == 0, wait_for_workers=False)
    os.environ["RINGCOMM_CHECK_AGREEMENT"] = "1"
    on = ringcomm.init(rank=rank, world_size=nproc, store=store, timeout=60)
    os.environ["RINGCOMM_CHECK_AGREEMENT"] = "0"
    off = ringcomm.init(rank=rank, world_size=nproc, store=store, timeout=60)
    times = {}
    for op, nbytes in CASES:
        for comm in (on, off):
            run_case(comm, op, nbytes, iters // 4)  # warm-up
        for _ in range(blocks):
            for label, comm in (("on", on), ("off", off)):
                times.setdefault((op, nbytes, label), []).append(run_case(comm, op, nbytes, iters))
    q.put((rank, times))
    on.close()
    off.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=15)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, a.nproc, port, a.iters, a.blocks, q)) for r in range(a.nproc)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(60)
    from ringcomm.bench.report import _cpu_model

    print(f"# CPU: {_cpu_model()}, {os.cpu_count()} cores; {a.nproc} ranks, shared memory; "
          f"{a.blocks} alternating blocks of {a.iters} calls; per-call time, median over blocks, slowest rank")
    print(f"{'op':<12}{'bytes':>7}{'check on (us)':>15}{'check off (us)':>16}{'ratio':>8}")
    for op, nbytes in CASES:
        med = {}
        for label in ("on", "off"):
            per_block = [max(res[r][(op, nbytes, label)][b] for r in res) for b in range(a.blocks)]
            med[label] = statistics.median(per_block) * 1e6
        print(f"{op:<12}{nbytes:>7}{med['on']:>15.2f}{med['off']:>16.2f}{med['on'] / med['off']:>8.2f}")


if __name__ == "__main__":
    main()
