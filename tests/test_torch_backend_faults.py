"""A failed collective under torch's own C++ consumers (issue 23, point 4).

DDP's reducer, FSDP2, functional collectives and pipelining read a Work's
future in C++; a ringcomm failure must reach them as a failed future (an
exception in the training loop), never as a "successful" future whose value
is the exception object (DDP then read it as its all_reduce result and the
survivors died of SIGSEGV).

- One rank SIGKILLed mid-way through DDP training (plain, and with a comm hook
  that drives get_future()): the survivors raise, naming the lost rank, well
  before the communicator's timeout.
- In one spawned group: for each consumer, a fresh ringcomm group whose rank 2
  aborts it mid-training: ranks 0 and 1 raise in their training loop, and the
  process goes on to the next consumer.
"""

import json
import os
import signal
import time
from datetime import timedelta

import pytest

import harness

COMM_TIMEOUT = 60.0
FAIL_WITHIN_S = 10.0  # far below COMM_TIMEOUT: the failure must come from detection


def _mlp(seed=0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _step(model, opt, step, rank):
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def _ddp(group, hook):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp(), process_group=group, bucket_cap_mb=0.001 if hook else 25)
    if hook:
        model.register_comm_hook(group, default_hooks.allreduce_hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _init_torch(ctx):
    import torch
    import torch.distributed as dist

    import ringcomm.torch_backend  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("ringcomm", store=ctx.store, rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timedelta(seconds=COMM_TIMEOUT))


def _killed_in_ddp(comm, hook, report_dir):
    """Rank 2 is SIGKILLed during step 5 (after its forward, before its
    backward: the others are in the step's all_reduce). Ranks 0 and 1 report
    what their training loop raised and when."""
    import torch.distributed as dist

    ctx = harness.context()
    r = ctx.rank
    _init_torch(ctx)
    model, opt = _ddp(None, hook)
    out = {"rank": r, "error": None}
    t_kill = None
    try:
        for step in range(1000):
            if r == 2 and step == 5:
                ctx.store.set("killed_at", repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            _step(model, opt, step, r)
    except Exception as e:  # noqa: BLE001 - what a training loop sees
        out["error"] = f"{type(e).__name__}: {e}"
    t_kill = float(ctx.store.get("killed_at"))
    out["after_kill_s"] = time.time() - t_kill
    with open(os.path.join(report_dir, f"rank{r}.json"), "w") as f:
        json.dump(out, f)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the group is broken by design
        pass
    return out


@pytest.mark.parametrize("hook", [False, True], ids=["ddp", "ddp_comm_hook"])
def test_ddp_survivors_raise_when_a_rank_is_killed(hook, tmp_path):
    try:
        harness.run_ranks(_killed_in_ddp, 3, (hook, str(tmp_path)), init=False, comm_timeout=None,
                          hard_timeout=120, grace=30)
    except (harness.RankDied, harness.RankError) as e:
        # rank 2 dies by design; a survivor that died (SIGSEGV) reports nothing below
        print(str(e)[:2000])
    fails = []
    for r in (0, 1):
        path = tmp_path / f"rank{r}.json"
        if not path.exists():
            fails.append(f"rank {r} reported nothing (did it crash?)")
            continue
        out = json.loads(path.read_text())
        print(f"rank {r}: raised {out['after_kill_s']:.2f} s after the kill: {str(out['error'])[:300]}")
        if out["error"] is None:
            fails.append(f"rank {r}: training went on without rank 2")
            continue
        if "rank 2" not in out["error"]:
            fails.append(f"rank {r}: the error does not name rank 2: {out['error'][:300]}")
        if out["after_kill_s"] > FAIL_WITHIN_S:
            fails.append(f"rank {r}: raised {out['after_kill_s']:.1f} s after the kill")
    assert not fails, "\n".join(fails)


def _aborted_under(ctx, what, run, fails, msgs):
    """A fresh ringcomm group of all ranks; `run(group)` trains on it for many
    steps; rank 2 aborts the group at its 4th step. Ranks 0 and 1 must raise
    from `run` within FAIL_WITHIN_S, naming rank 2."""
    import torch.distributed as dist

    r = ctx.rank
    group = dist.new_group(backend="ringcomm")
    t0 = time.monotonic()
    try:
        run(group, r)
        fails.append(f"{what}: rank {r}'s training ended without an error")
    except Exception as e:  # noqa: BLE001
        took = time.monotonic() - t0
        text = f"{type(e).__name__}: {e}"
        if r != 2:
            if "rank 2" not in text:
                fails.append(f"{what}: rank {r}'s error does not name rank 2: {text[:300]}")
            if took > FAIL_WITHIN_S + 5:
                fails.append(f"{what}: rank {r} needed {took:.1f} s")
        msgs.append(f"{what}: rank {r} raised after {took:.2f} s: {text[:160]}")
    ctx.store.set(f"{what}/done/{r}", "1")
    ctx.store.wait([f"{what}/done/{q}" for q in range(ctx.world_size)], timedelta(seconds=60))


def _abort_at(group, r, step):
    if r == 2 and step == 3:
        import torch

        group._get_backend(torch.device("cpu")).communicator.abort("rank 2 aborts on purpose")
        raise RuntimeError("rank 2 aborted its group")


def _consumers(comm):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    ctx = harness.context()
    _init_torch(ctx)
    fails, msgs = [], []

    def ddp(hook):
        def run(group, r):
            model, opt = _ddp(group, hook)
            for step in range(200):
                _abort_at(group, r, step)
                _step(model, opt, step, r)
        return run

    def fsdp2(group, r):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        model = _mlp()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=DeviceMesh.from_group(group, "cpu"))
        fully_shard(model, mesh=DeviceMesh.from_group(group, "cpu"))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(200):
            _abort_at(group, r, step)
            _step(model, opt, step, r)

    def functional(group, r):
        for step in range(200):
            _abort_at(group, r, step)
            y = funcol.all_reduce(torch.ones(4096) * (r + 1), "sum", group)
            float(y.sum())  # waits (wait_tensor: C++ Work::wait)

    def async_wait(group, r):
        for step in range(200):
            _abort_at(group, r, step)
            dist.all_reduce(torch.ones(4096), group=group, async_op=True).wait()

    def future_wait(group, r):
        for step in range(200):
            _abort_at(group, r, step)
            fut = dist.all_reduce(torch.ones(4096), group=group, async_op=True).get_future()
            fut.then(lambda f: f.value()).wait()

    for what, run in (("DDP", ddp(False)), ("DDP comm hook", ddp(True)), ("FSDP2", fsdp2),
                      ("functional all_reduce", functional), ("Work.wait", async_wait),
                      ("future.then", future_wait)):
        _aborted_under(ctx, what, run, fails, msgs)
    dist.destroy_process_group()
    return {"fails": fails, "msgs": msgs}


def test_failed_collectives_reach_torch_consumers_as_errors():
    harness.print_and_check(harness.run_ranks(_consumers, 3, init=False, hard_timeout=240))
