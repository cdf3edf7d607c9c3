"""What async_op=True + wait() costs over the blocking call, on ringcomm's own API.

2 ranks on this host (shared memory), 4-byte float32 calls, numpy buffers:
  all_reduce                   comm.all_reduce(x)
  all_reduce async+wait        comm.all_reduce(x, async_op=True).wait()
  send/recv ping-pong          blocking send and recv, half a round trip per call
  isend/irecv+wait ping-pong   the same with async_op=True and wait()
Each round times `--calls` calls of each way in turn (the order rotates per
round, a barrier before each). Reported per way: the median over rounds of
rank 0's time per call, and the median over rounds of its ratio to the
blocking form measured in the same round (a round's ratio is taken before
the median: drift between rounds cancels out). Launches on these small
machines are bimodal, so run it several times and say how often each mode
came.

    python benchmarks/async_overhead.py [--rounds 21] [--calls 10000] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import time

from ringcomm.bench.report import _cpu_model
from torch_overhead import print_header, run_two_ranks  # (this folder: the script's own)

# (way, the blocking way its ratio is to)
WAYS = [
    ("all_reduce", None),
    ("all_reduce async+wait", "all_reduce"),
    ("send/recv ping-pong (1/2 RTT)", None),
    ("isend/irecv+wait ping-pong (1/2 RTT)", "send/recv ping-pong (1/2 RTT)"),
]


def rank_main(rank, port, rounds, calls, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    import numpy as np

    import ringcomm

    comm = ringcomm.init()
    x = np.ones(1, np.float32)
    peer = 1 - rank

    def ar():
        comm.all_reduce(x)

    def ar_async():
        comm.all_reduce(x, async_op=True).wait()

    def pingpong():
        if rank == 0:
            comm.send(x, peer)
            comm.recv(x, peer)
        else:
            comm.recv(x, peer)
            comm.send(x, peer)

    def pingpong_async():
        if rank == 0:
            comm.send(x, peer, async_op=True).wait()
            comm.recv(x, peer, async_op=True).wait()
        else:
            comm.recv(x, peer, async_op=True).wait()
            comm.send(x, peer, async_op=True).wait()

    fns = dict(zip([w for w, _ in WAYS], [ar, ar_async, pingpong, pingpong_async]))
    names = list(fns)
    for f in fns.values():  # warm up
        for _ in range(min(calls, 2000)):
            f()
    samples = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            comm.barrier()
            f = fns[n]
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            dt = (time.perf_counter() - t0) / calls
            samples[n].append(dt / 2 if "ping-pong" in n else dt)
    comm.barrier()
    comm.close()
    if rank == 0:
        q.put(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--json")
    a = p.parse_args()
    samples = run_two_ranks(rank_main, a.rounds, a.calls)
    cpu = _cpu_model()
    print_header(__file__, a.rounds, a.calls)
    print(f"{'way':40s} {'median us':>10s} {'min us':>8s} {'ratio to blocking':>18s}")
    out = {}
    for n, base in WAYS:
        v = samples[n]
        med = statistics.median(v) * 1e6
        ratio = statistics.median([s / b for s, b in zip(v, samples[base])]) if base else None
        out[n] = {"median_us": med, "min_us": min(v) * 1e6, "ratio_to_blocking": ratio}
        rtext = f"{ratio:18.2f}" if ratio is not None else f"{'':18s}"
        print(f"{n:40s} {med:10.2f} {min(v) * 1e6:8.2f} {rtext}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu, "rounds": a.rounds, "calls": a.calls, "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
