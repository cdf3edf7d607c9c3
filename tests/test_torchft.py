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


REPLICA = r'''
import json, os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
from torchft import Manager
from torchft.ddp import DistributedDataParallel
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupGloo

rid, backend, lighthouse, steps, kill_at, out, min_replicas, wait_from, together, wait_file = sys.argv[1:11]
rid, steps, kill_at, min_replicas, wait_from = int(rid), int(steps), int(kill_at), int(min_replicas), int(wait_from)
torch.set_num_threads(1)
if backend == "ringcomm":
    from ringcomm.torch_backend.ft import ProcessGroupRingcommFT
    pg = ProcessGroupRingcommFT(timeout=timedelta(seconds=10))
else:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

def state_dict():
    return {"model": model.state_dict(), "optim": opt.state_dict()}

def load_state_dict(sd):
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])

manager = Manager(pg=pg, min_replica_size=min_replicas, load_state_dict=load_state_dict, state_dict=state_dict,
                  replica_id=f"replica{rid}", store_addr="localhost", store_port=store.port, rank=0, world_size=1,
                  lighthouse_addr=lighthouse, timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=30),
                  connect_timeout=timedelta(seconds=30))
ddp = DistributedDataParallel(manager, model)
optim = OptimizerWrapper(manager, opt)
# Start together with the replicas named (the lighthouse would otherwise form
# its first quorum of whoever finished importing torch first).
open(out + ".ready", "w").close()
peers = [p for p in together.split(",") if p]
until = time.monotonic() + 60
while not all(os.path.exists(p + ".ready") for p in peers) and time.monotonic() < until:
    time.sleep(0.01)
log = []
waited = 0.0
while manager.current_step() < steps:
    step = manager.current_step()
    slept = 0.0
    # At step wait_from: wait until the replacement is up (it then joins the next quorum).
    if step == wait_from and wait_file and not waited:
        t0 = time.monotonic()
        while not os.path.exists(wait_file) and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        slept = waited = time.monotonic() - t0
    optim.zero_grad()  # starts the quorum; a replacement heals here (its step jumps)
    step = manager.current_step()
    g = torch.Generator().manual_seed(1000 * step + rid)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    if step == kill_at:
        with open(out + ".killed", "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    loss.backward()
    optim.step()  # steps the optimizer when every participant committed (should_commit)
    log.append({"step": step, "t": time.time(), "slept": slept, "loss": loss.item(),
                "committed": manager.current_step() > step,
                "participants": manager.num_participants(), "after": manager.current_step()})
with open(out, "w") as f:
    json.dump({"log": log, "params": [p.detach().flatten().tolist() for p in model.parameters()]}, f)
manager.shutdown(wait=False)
'''


def _out(tmp, rid, backend, tag=""):
    return str(tmp / f"{backend}-{rid}{tag}.json")


def _start(tmp, rid, backend, lighthouse, kill_at=-1, min_replicas=2, tag="", wait_from=-1, together=(),
           wait_file=""):
    out = _out(tmp, rid, backend, tag)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen([sys.executable, "-c", REPLICA, str(rid), backend, lighthouse, str(STEPS), str(kill_at),
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
