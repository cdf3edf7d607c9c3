"""One rank of test_netfault.py, run inside a network namespace of its own:

    python netfault_prog.py SCENARIO RANK OUT_DIR

SCENARIO is "mid" (64 MiB all_reduces back to back until one fails: the test takes
the link down while they run) or "idle" (the link goes down while the ranks wait
between calls; then one all_reduce). The rendezvous is a FileStore in OUT_DIR, so
the store does not depend on the link under test. RINGCOMM_HOST_ID (a host of its
own), RINGCOMM_SOCKET_IFNAME (the veth end) and RINGCOMM_TIMEOUT come from the
test.

The rank talks to the test through files in OUT_DIR: events `ev-<rank>-<name>.json`
(written atomically, with time.monotonic(), which is the same clock in every process
of the machine), the report `rank<R>.json` (written as soon as the failure is seen,
and again after close()), and the test's `go` file for the idle scenario. SIGUSR1
dumps the Python stacks to stderr (the test sends it before it kills a hung rank).
"""

import faulthandler
import json
import os
import signal
import sys
import time
import traceback

import numpy as np

BIG = 16 << 20  # float32 elements: 64 MiB
MAX_BIG_CALLS = 400  # the mid scenario gives up after these (the link never went down)


def _write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def main(scenario, rank, out_dir):
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import torch.distributed as dist

    import ringcomm

    peer = 1 - rank
    report = {"rank": rank, "scenario": scenario, "fails": [], "error": None, "type": None}
    path = os.path.join(out_dir, f"rank{rank}.json")

    def event(name, **kw):
        _write(os.path.join(out_dir, f"ev-{rank}-{name}.json"), dict(kw, t=time.monotonic()))

    store = dist.FileStore(os.path.join(out_dir, "store"), 2)
    timeout = float(os.environ["RINGCOMM_TIMEOUT"])
    comm = ringcomm.init(rank=rank, world_size=2, store=store, timeout=timeout)
    report["transports"] = comm.transports
    if comm.transports[peer] != "tcp":
        report["fails"].append(f"the peer is reached by {comm.transports[peer]}, not TCP")

    # A few collectives while the link is up.
    x = np.full(1000, rank + 1, np.float32)
    comm.all_reduce(x)
    if not (x == 3).all():
        report["fails"].append(f"warm-up all_reduce gave {x[:4]}")
    y = np.full(10, rank, np.int64)
    comm.broadcast(y, src=1)
    if not (y == 1).all():
        report["fails"].append(f"warm-up broadcast gave {y[:4]}")
    out = np.zeros(2 * 777, np.int32)
    comm.all_gather(out, np.full(777, rank, np.int32))
    if not (out == np.repeat([0, 1], 777)).all():
        report["fails"].append("warm-up all_gather gave a wrong result")
    comm.barrier()

    big = np.ones(BIG, np.float32)
    t0 = time.monotonic()
    comm.all_reduce(big)
    report["big_all_reduce_s"] = time.monotonic() - t0
    if not (big[:: 1 << 16] == 2).all():
        report["fails"].append("warm-up 64 MiB all_reduce gave a wrong result")
    comm.barrier()
    event("warm", big_all_reduce_s=report["big_all_reduce_s"])

    t_call = None
    try:
        if scenario == "mid":
            event("looping")
            for i in range(MAX_BIG_CALLS):
                t_call = time.monotonic()
                report["calls_before_failure"] = i
                comm.all_reduce(big)
            report["fails"].append(f"{MAX_BIG_CALLS} 64 MiB all_reduces succeeded: the link never went down?")
        else:
            event("idle")
            go = os.path.join(out_dir, "go")
            deadline = time.monotonic() + 60
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.005)
            t_call = time.monotonic()
            comm.all_reduce(np.ones(1000, np.float32))
            report["fails"].append("all_reduce succeeded with the link down")
    except ringcomm.RingcommError as e:  # TimeoutError is one
        report.update(error=str(e), type=type(e).__name__)
    except BaseException as e:  # noqa: BLE001
        report.update(error=f"{type(e).__name__}: {e}", type=type(e).__name__)
    report["t_raise"] = time.monotonic()
    report["t_call"] = t_call
    _write(path, report)

    # The communicator refuses further calls at once.
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(4, np.float32))
        report["after"] = "an all_reduce after the failure succeeded"
    except ringcomm.RingcommError as e:
        report["after"] = f"{type(e).__name__} after {time.monotonic() - t0:.2f}s: {e}"
    _write(path, report)

    t0 = time.monotonic()
    try:
        comm.close()
        report["close"] = "ok"
    except BaseException as e:  # noqa: BLE001
        report["close"] = f"raised {type(e).__name__}: {e}"
    report["close_s"] = time.monotonic() - t0
    report["t_closed"] = time.monotonic()
    _write(path, report)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(3)
