"""torchft's Manager on ringcomm (issue 23, point 3): ringcomm.torch_backend.ft.

Each replica group is one process (its own TCPStore, a torchft Manager, torchft's
DistributedDataParallel and OptimizerWrapper); the lighthouse runs in the test
process. The same jobs run on torchft's own ProcessGroupGloo beside ringcomm's:

- fault-free, 2 replicas (min_replica_size 2): every step's loss and the final
  parameters equal on both process groups;
- replica 1 SIGKILLed at step 4: replica 0 goes on alone, a new replica 1
  process joins, heals from replica 0 (torchft's checkpoint transport) and both
  finish with the same parameters. Printed: the time from the kill to replica
  0's next committed step, per process group. (torchft 0.2's own DDP comm hook
  fails when Gloo's Work.wait() raises for a dead peer; ringcomm's group
  reports the failure through the Work's future, which torchft turns into a
  skipped step: ringcomm.torch_backend.ft._ReportingWork.)
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

torchft = pytest.importorskip("torchft")

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 10
KILL_STEP = 4


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REPLICA = os.path.join(HERE, "..", "benchmarks", "torchft_replica.py")



def _out(tmp, rid, backend, tag=""):
    return str(tmp / f"{backend}-{rid}{tag}.json")


def _start(tmp, rid, backend, lighthouse, kill_at=-1, min_replicas=2, tag="", wait_from=-1, together=(),
           wait_file=""):
    out = _out(tmp, rid, backend, tag)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen([sys.executable, REPLICA, str(rid), backend, lighthouse, str(STEPS), str(kill_at),
                             out, str(min_replicas), str(wait_from), ",".join(together), wait_file], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    return proc, out


def _finish(procs, timeout=150):
    deadline = time.monotonic() + timeout
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            out += "\n[killed: timeout]"
        outputs.append(out)
    return outputs


def _load(path):
    with open(path) as f:
        return json.load(f)


def _lighthouse(min_replicas):
    """join_timeout: a quorum waits this long for every replica that heartbeats
    (both at the start; the replacement later); heartbeat_timeout: a replica
    silent this long (the killed one) is left out."""
    from torchft._torchft import LighthouseServer

    return LighthouseServer(bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=3000,
                            heartbeat_timeout_ms=1000)


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torchft")
    results = {}
    for backend in ("gloo", "ringcomm"):
        lh = _lighthouse(2)
        try:
            both = [_out(tmp, rid, backend) for rid in (0, 1)]
            started = [_start(tmp, rid, backend, lh.address(), together=both) for rid in (0, 1)]
            outs = _finish([p for p, _ in started])
        finally:
            lh.shutdown()
        for (p, path), out in zip(started, outs):
            assert p.returncode == 0, f"{backend}: a replica failed:\n{out[-4000:]}"
        results[backend] = [_load(path) for _, path in started]
    return results


def test_fault_free_matches_torchft_gloo(fault_free):
    import torch

    fails = []
    for rid in (0, 1):
        a, b = fault_free["ringcomm"][rid], fault_free["gloo"][rid]
        la = [e["loss"] for e in a["log"]]
        lb = [e["loss"] for e in b["log"]]
        if len(la) != len(lb) or not torch.allclose(torch.tensor(la), torch.tensor(lb), rtol=1e-5, atol=1e-7):
            fails.append(f"replica {rid}: losses {la[:4]}... on ringcomm, {lb[:4]}... on gloo")
        if not all(e["committed"] and e["participants"] == 2 for e in a["log"]):
            fails.append(f"replica {rid}: a step on ringcomm was not committed by both: {a['log']}")
        for i, (pa, pb) in enumerate(zip(a["params"], b["params"])):
            if not torch.allclose(torch.tensor(pa), torch.tensor(pb), rtol=1e-5, atol=1e-7):
                fails.append(f"replica {rid}: parameter {i} differs between ringcomm and gloo")
    assert not fails, "\n".join(fails)


@pytest.mark.parametrize("backend", ["ringcomm", "gloo"])
def test_replica_killed_then_replaced(backend, tmp_path):
    import torch

    lh = _lighthouse(1)
    try:
        both = [_out(tmp_path, rid, backend) for rid in (0, 1)]
        r0, out0 = _start(tmp_path, 0, backend, lh.address(), min_replicas=1, wait_from=KILL_STEP + 2, together=both,
                          wait_file=_out(tmp_path, 1, backend, "-replacement") + ".ready")
        r1, out1 = _start(tmp_path, 1, backend, lh.address(), kill_at=KILL_STEP, min_replicas=1, together=both)
        killed = out1 + ".killed"
        deadline = time.monotonic() + 90
        while not os.path.exists(killed) and time.monotonic() < deadline and r0.poll() is None:
            time.sleep(0.05)
        assert os.path.exists(killed), "replica 1 never reached the kill step:\n" + "\n".join(_finish([r0, r1], 5))
        _finish([r1], 10)
        r1b, out1b = _start(tmp_path, 1, backend, lh.address(), min_replicas=1, tag="-replacement")
        outs = _finish([r0, r1b])
    finally:
        lh.shutdown()
    if backend == "gloo" and r0.returncode != 0 and "in _comm_hook\n    assert fut._fut" in outs[0] \
            and ("Connection closed by peer" in outs[0] or "Connection reset by peer" in outs[0]):
        # torchft 0.2's DDP comm hook asserts when Gloo's Work.wait() raises (a peer
        # died mid-allreduce): the reference, not the code under test, fails here.
        pytest.xfail("torchft's Gloo group: replica 0 died of AssertionError in torchft.ddp._comm_hook "
                     "(Gloo's Work.wait raised: the peer's connection closed)")
    assert r0.returncode == 0, f"replica 0 failed:\n{outs[0][-4000:]}"
    assert r1b.returncode == 0, f"the replacement failed:\n{outs[1][-4000:]}"
    a, b = _load(out0), _load(out1b)
    with open(killed) as f:
        t_kill = float(f.read())
    after = [e for e in a["log"] if e["step"] >= KILL_STEP and e["committed"]]
    assert after, f"replica 0 committed no step after the kill: {a['log']}"
    first = after[0]
    healed = [e for e in b["log"] if e["committed"]]
    print(f"{backend}: replica 0's next committed step (step {first['step']}, {first['participants']} "
          f"participant(s)) {first['t'] - first['slept'] - t_kill:.2f} s after the kill; the replacement's first committed step "
          f"is {healed[0]['after'] - 1 if healed else None}; replica 0 skipped "
          f"{sum(1 for e in a['log'] if not e['committed'])} step(s)")
    for i, (pa, pb) in enumerate(zip(a["params"], b["params"])):
        assert torch.allclose(torch.tensor(pa), torch.tensor(pb), rtol=1e-6, atol=1e-7), \
            f"parameter {i}: the replacement ended different from replica 0"
    assert a["log"][-1]["after"] == STEPS and b["log"][-1]["after"] == STEPS
