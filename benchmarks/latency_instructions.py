"""Instructions per call of small synchronous calls on rank 0 of a 2-rank job, counted by
callgrind (not a test; instruction counts repeat under load where wall-clock times do not).

    python benchmarks/latency_instructions.py [--calls 2000] [--cases ar4,ar1k,bc8,sr8]

Rank 1 runs natively (pinned to CPU 1, at real-time priority when allowed, spinning), so
that rank 0 rarely waits; rank 0 runs under `valgrind --tool=callgrind`, pinned to CPU 0,
collecting only inside ringcomm::Communicator::all_reduce / broadcast / send / recv (the
C++ entry points: Python and argument conversion are not counted). Cases: ar<size>
(ar4, ar1k, ar16k, ar64k, ...): all_reduce of that many bytes of float32; bc8: broadcast of 8 B from rank 0; sr8: rank 0 sends
8 B to rank 1. Needs valgrind and an unstripped ringcomm._C (the build directory's copy:
point PYTHONPATH at a package directory holding it); the rendezvous is a file store, so
torch is not imported under valgrind.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

TOGGLES = ["ringcomm::Communicator::all_reduce(*", "ringcomm::Communicator::broadcast(*",
           "ringcomm::Communicator::send(*", "ringcomm::Communicator::recv(*"]


class FileStore:
    """The four store methods ringcomm.init uses, over files in one directory."""

    def __init__(self, path):
        self.path = path

    def _p(self, key):
        return os.path.join(self.path, key.replace("/", "_"))

    def set(self, key, value):
        if isinstance(value, str):
            value = value.encode()
        tmp = f"{self._p(key)}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(value)
        os.rename(tmp, self._p(key))

    def check(self, keys):
        return all(os.path.exists(self._p(k)) for k in keys)

    def wait(self, keys, timeout=None):
        while not self.check(keys):
            time.sleep(0.01)

    def get(self, key):
        self.wait([key])
        with open(self._p(key), "rb") as f:
            return f.read()


def _ar_bytes(case):
    """ar4 -> 4, ar1k -> 1024, ar64k -> 65536: an all_reduce case's size in bytes."""
    m = re.fullmatch(r"ar(\d+)([km]?)", case)
    if not m:
        raise SystemExit(f"unknown case {case!r}: ar<bytes>[k|m], bc8 or sr8")
    return int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[m.group(2)]


def rank_main(rank, store_dir, calls, case):
    import numpy as np

    import ringcomm

    comm = ringcomm.init(rank=rank, world_size=2, store=FileStore(store_dir), timeout=600)
    ar = np.ones(_ar_bytes(case) // 4, np.float32) if case.startswith("ar") else None
    b8 = np.ones(1, np.float64)
    comm.barrier()
    for _ in range(calls):
        if ar is not None:
            comm.all_reduce(ar)
        elif case == "bc8":
            comm.broadcast(b8, src=0)
        elif rank == 0:
            comm.send(b8, 1)
        else:
            comm.recv(b8, 0)
    comm.barrier()
    comm.close()


def measure(case, calls, keep=None):
    store = tempfile.mkdtemp(prefix="ringcomm-cg-")
    out = os.path.join(store, "callgrind.out")
    env = {**os.environ, "RINGCOMM_COST_MODEL": "default", "RINGCOMM_YIELD_US": "0", "RINGCOMM_SPIN_US": "60000000"}
    me = [sys.executable, os.path.abspath(__file__), "--rank"]
    peer_cmd = ["taskset", "-c", "1"] + me + ["1", store, str(calls), case]
    if shutil.which("chrt") and os.geteuid() == 0:
        peer_cmd = ["chrt", "-f", "10"] + peer_cmd
    peer = subprocess.Popen(peer_cmd, env=env)
    cg = ["taskset", "-c", "0", "valgrind", "--tool=callgrind", "--collect-atstart=no",
          f"--callgrind-out-file={out}"] + [f"--toggle-collect={t}" for t in TOGGLES]
    res = subprocess.run(cg + me + ["0", store, str(calls), case], env=env, capture_output=True, text=True)
    peer.wait()
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(out, os.path.join(keep, f"callgrind.{case}.out"))  # for callgrind_annotate
    shutil.rmtree(store, ignore_errors=True)
    m = re.search(r"Collected : (\d+)", res.stderr)
    if not m:
        raise SystemExit(f"callgrind reported no count for {case}:\n{res.stderr[-2000:]}")
    return int(m.group(1)) / calls


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--rank":
        rank_main(int(argv[1]), argv[2], int(argv[3]), argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--cases", default="ar4,ar1k,bc8,sr8")
    ap.add_argument("--keep", metavar="DIR", help="keep each case's callgrind output here (callgrind_annotate)")
    args = ap.parse_args(argv)
    for case in args.cases.split(","):
        print(f"{case:6s} {measure(case, args.calls, args.keep):10.0f} instructions per call (rank 0)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
