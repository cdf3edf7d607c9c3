"""One torchft replica group of one process, for tests/test_torchft.py and
benchmarks/recovery_table.py: a torchft Manager on ringcomm's process group
(ringcomm.torch_backend.ft) or torchft's own Gloo group, torchft's DDP and
OptimizerWrapper over a small MLP, each step's data seeded by (step, replica).

    python torchft_replica.py RID BACKEND LIGHTHOUSE STEPS KILL_AT OUT MIN_REPLICAS WAIT_FROM TOGETHER WAIT_FILE [STEP_TIME]

KILL_AT >= 0: SIGKILL itself in that step (after the forward); OUT gets the
per-step log and the final parameters (JSON); TOGETHER: comma-separated OUT
paths of the replicas to start with (each writes OUT.ready once its Manager
is up); WAIT_FROM / WAIT_FILE: at that step, wait until that file exists (a
replacement is up). STEP_TIME: seconds of other work per step.
"""
import json, os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
from torchft import Manager
from torchft.ddp import DistributedDataParallel
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupGloo

rid, backend, lighthouse, steps, kill_at, out, min_replicas, wait_from, together, wait_file = sys.argv[1:11]
step_time = float(sys.argv[11]) if len(sys.argv) > 11 else 0.0
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
    time.sleep(step_time)
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
