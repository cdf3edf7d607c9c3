"""Per-call cost of going through torch.distributed: a 4-byte all_reduce.

Four ways, measured side by side in one run, 2 ranks on this host:
  ringcomm API    comm.all_reduce(x)                    (the group's own Communicator)
  dist/ringcomm   dist.all_reduce(x) on the "ringcomm" group
  dist/gloo       dist.all_reduce(x) on a gloo group over the same ranks
  dist/no-op      dist.all_reduce(x) on a Python ProcessGroup that does nothing
                  and returns a completed Work: the floor torch's own dispatch
                  to a Python process group (ringcomm's kind) costs
  dist/C++ no-op  the same on torch's own do-nothing C++ backend (FakeProcessGroup,
                  the "fake" backend): the floor of a C++ c10d backend, which
                  torch reaches through its op dispatcher
Each round times `--calls` back-to-back calls of each way in turn (the order
rotates per round); the figure is the median over rounds of the per-call time
of rank 0 (both ranks take part in every call). Also the same for async_op=True
followed by wait(), and for a send/recv ping-pong (half a round trip).

    python benchmarks/torch_overhead.py [--rounds 30] [--calls 200] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta

from ringcomm.bench.report import _cpu_model


def _register_noop_backend():
    """"noop": a Python ProcessGroup whose calls do nothing (the dispatch floor)."""
    import torch.distributed as dist

    class NoWork(dist._Work):
        def wait(self, timeout=None):
            return True

        def is_completed(self):
            return True

        def is_success(self):
            return True

    class NoOpGroup(dist.ProcessGroup):
        def getBackendName(self):
            return "noop"

        def allreduce(self, tensors, opts=None):
            return NoWork()

        def send(self, tensors, dst, tag=0):
            return NoWork()

        def recv(self, tensors, src, tag=0):
            return NoWork()

        def barrier(self, opts=None):
            return NoWork()

    dist.Backend.register_backend("noop", lambda o, _: NoOpGroup(o.group_rank, o.group_size),
                                  extended_api=True, devices=["cpu"])


def rank_main(rank, port, rounds, calls, q):
    world = 2
    import torch
    import torch.distributed as dist

    import ringcomm.torch_backend  # noqa: F401
    _register_noop_backend()

    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("ringcomm", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    rc = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    noop = dist.new_group(backend="noop")
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    fake = dist.new_group(backend="fake")
    comm = rc.communicator
    x = torch.ones(1, dtype=torch.float32)
    peer = 1 - rank

    def api():
        comm.all_reduce(x)

    def via(group):
        return lambda: dist.all_reduce(x, group=group)

    def via_async(group):
        return lambda: dist.all_reduce(x, group=group, async_op=True).wait()

    def api_async():
        comm.all_reduce(x, async_op=True).wait()

    native = comm._native

    def native_async():  # the native communicator's call alone: no Python Communicator method
        native.all_reduce(x, 0, True).wait()

    def pingpong(group):
        def f():
            if rank == 0:
                dist.send(x, peer, group=group)
                dist.recv(x, peer, group=group)
            else:
                dist.recv(x, peer, group=group)
                dist.send(x, peer, group=group)
        return f

    def api_pingpong():
        if rank == 0:
            comm.send(x, peer)
            comm.recv(x, peer)
        else:
            comm.recv(x, peer)
            comm.send(x, peer)

    ways = {
        "all_reduce: ringcomm API": api,
        "all_reduce: dist/ringcomm": via(rc),
        "all_reduce: dist/gloo": via(gloo),
        "all_reduce: dist/no-op (floor)": via(noop),
        "all_reduce: dist/C++ no-op": via(fake),
        "all_reduce async+wait: ringcomm API": api_async,
        "all_reduce async+wait: dist/ringcomm": via_async(rc),
        "all_reduce async+wait: dist/gloo": via_async(gloo),
        "all_reduce async+wait: dist/no-op (floor)": via_async(noop),
        "all_reduce async+wait: dist/C++ no-op": via_async(fake),
        "all_reduce async+wait: native call": native_async,
        "send/recv ping-pong (1/2 RTT): ringcomm API": api_pingpong,
        "send/recv ping-pong (1/2 RTT): dist/ringcomm": pingpong(rc),
        "send/recv ping-pong (1/2 RTT): dist/gloo": pingpong(gloo),
        "send/recv ping-pong (1/2 RTT): dist/no-op (floor)": pingpong(noop),
        "send/recv ping-pong (1/2 RTT): dist/C++ no-op": pingpong(fake),
    }
    names = list(ways)
    for f in ways.values():  # warm up
        for _ in range(20):
            f()
    samples = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            dist.barrier(group=gloo)
            f = ways[n]
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            dt = (time.perf_counter() - t0) / calls
            samples[n].append(dt / 2 if "ping-pong" in n else dt)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    if rank == 0:
        q.put(samples)


def run_two_ranks(rank_main, *args):
    """Runs rank_main(rank, port, *args, q) on two spawned ranks; returns what rank 0 put on q."""
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port) + args + (q,)) for r in range(2)]
    for pr in procs:
        pr.start()
    try:
        return q.get(timeout=1800)
    finally:
        for pr in procs:
            pr.join(60)
            if pr.is_alive():
                pr.kill()


def print_header(script, rounds, calls):
    """The CPU, the load and the command, as the first lines of a report."""
    print(f"# {_cpu_model()}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the end; "
          f"{rounds} rounds x {calls} calls, rank 0's per-call time")
    print(f"# command: python benchmarks/{os.path.basename(script)} --rounds {rounds} --calls {calls}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json")
    a = p.parse_args()
    samples = run_two_ranks(rank_main, a.rounds, a.calls)
    cpu = _cpu_model()
    print_header(__file__, a.rounds, a.calls)
    print(f"{'way':48s} {'median us':>10s} {'min us':>8s} {'max us':>8s}")
    out = {}
    for n, v in samples.items():
        med = statistics.median(v) * 1e6
        out[n] = {"median_us": med, "min_us": min(v) * 1e6, "max_us": max(v) * 1e6}
        print(f"{n:48s} {med:10.1f} {min(v) * 1e6:8.1f} {max(v) * 1e6:8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu, "rounds": a.rounds, "calls": a.calls, "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
