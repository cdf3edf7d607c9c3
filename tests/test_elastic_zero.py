"""ZeRO training that survives lost ranks and takes replacements (issue 23,
point 2): ringcomm.parallel.ElasticZeroDataParallel.

World 4, fp32, the model and fixed global batches of examples/elastic_dp.py,
AdamW (two moments and a step count per shard must survive). The reference is
the same model trained on the whole global batch in one process: every step's
loss and the final parameters must equal it within 1e-5 (relative), on every
rank, through three events:

- step 4, after its optimizer step: rank 1 is SIGKILLed before it sends its
  snapshot of step 4 (its predecessor may have finished that exchange, its
  successor cannot have): the survivors agree on the older generation, which
  all of them still keep, and redo step 4 at world 3.
- step 7: rank 2 is SIGKILLed as its forward begins: its shards come back from
  its successor's copy, and step 7 is redone at world 2; it must complete
  within 1 s of the kill.
- step 11: two replacements (ranks 4 and 5 of the spawned group, processes of
  their own) are admitted at its end (world back to 4): each member sends its
  own shards, the state is re-cut for 4 ranks, and the replacements train
  steps 12.. with it.

And a loss the redundancy cannot absorb: two neighbours on the ring (ranks 1
and 2) lost together: rank 1's shards and their only copy are gone, and both
survivors raise the same RingcommError naming them.
"""
import os
import signal
import sys
import time
from datetime import timedelta

import pytest

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import elastic_dp  # noqa: E402  (the model, global batches and loss of the example)

STEPS = 16
CUT_STEP = 4           # rank 1 dies between this step's optimizer step and its exchange
KILL_STEP = 7          # rank 2 dies as this step's forward begins
JOIN_STEP = 11         # two replacements are admitted at the end of this step
JOB = "zero-test"
LR = 0.01


def _reference():
    import torch

    model = elastic_dp.make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = elastic_dp.mse(model, *elastic_dp.batch_of(step))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def _shard_state_bytes(z):
    """What one generation of this rank's shard state takes: master + AdamW's two moments."""
    return sum(3 * u.shard * 4 for u in z.units)


def _survive(comm, stage):
    import torch

    import ringcomm
    from ringcomm import recovery
    from ringcomm.parallel import ElasticZeroDataParallel, ZeroDataParallel

    torch.set_num_threads(1)
    ctx = harness.context()
    r = ctx.rank
    if r >= 4:
        return _replacement(ctx)
    comm = ringcomm.init(rank=r, world_size=4, store=ctx.store, timeout=60)
    model = elastic_dp.make_model()
    z = ZeroDataParallel(model, comm, stage=stage, optimizer_class=torch.optim.AdamW, lr=LR,
                         bucket_cap_mb=0.002)  # several buckets under stages 1 and 2
    el = ElasticZeroDataParallel(z, elastic_dp.batch_of, job=JOB)
    protect = el._protect

    def cut(gen):  # rank 1 dies before it exchanges its snapshot of CUT_STEP
        if gen == CUT_STEP + 1 and r == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        protect(gen)

    el._protect = cut

    def loss_fn(zz, x, y):
        if el.step == KILL_STEP and r == 2:
            ctx.store.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if el.step == JOIN_STEP and r == 0:  # both replacements wait before rank 0 looks (not sooner)
            ctx.store.set("join/now", "1")
            deadline = time.monotonic() + 60
            while recovery.waiting(ctx.store, JOB) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
        return elastic_dp.mse(zz, x, y)

    redundancy = []
    losses, done_at = {}, {}
    while el.step < STEPS:
        loss = el.train_step(loss_fn)
        losses[el.step - 1] = loss
        done_at[el.step - 1] = time.time()
        if el.step == 2:  # AdamW's moments exist from step 1 on
            redundancy += [el.redundancy_bytes(), _shard_state_bytes(el.zero)]
    redundancy += [el.redundancy_bytes(), _shard_state_bytes(el.zero)]
    return {**_finish(el, losses), "redundancy": redundancy,
            "after_kill_s": done_at[KILL_STEP] - float(ctx.store.get("killed_at"))}


def _replacement(ctx):
    from ringcomm.parallel import ElasticZeroDataParallel

    ctx.store.wait(["join/now"], timedelta(seconds=60))
    model = elastic_dp.make_model()
    for p in model.parameters():  # its own values: the members' must win
        p.data.normal_()
    el = ElasticZeroDataParallel.join(model, elastic_dp.batch_of, store=ctx.store, job=JOB, timeout=60)
    first = el.step
    losses = {}
    while el.step < STEPS:
        losses[el.step - 1] = el.train_step(elastic_dp.mse)
    return {**_finish(el, losses), "first": first}


def _finish(el, losses):
    params = [p.clone() for p in el.zero.full_parameters()]
    out = {"losses": losses, "params": params, "recoveries": el.recoveries, "world": el.comm.world_size,
           "rank": el.comm.rank}
    el.comm.close()
    return out


@pytest.mark.parametrize("stage,transport", [(1, "shm"), (2, "tcp"), (3, "shm")])
def test_zero_survives_lost_ranks_and_takes_replacements(stage, transport):
    import torch

    env = {"RINGCOMM_TRANSPORT": transport} if transport == "tcp" else {}
    res = harness.survivors_of(_survive, 6, [1, 2], (stage,), env=env, init=False, hard_timeout=240,
                               grace=60)
    ref_losses, ref_params = _reference()
    fails = []
    for r in (0, 3, 4, 5):
        out = res[r]
        got = [(x["step"], x["lost"], x["joined"], x["world"]) for x in out["recoveries"]]
        print(f"rank {r}: " + "; ".join(
            f"step {x['step']}: lost {x['lost']} joined {x['joined']} -> world {x['world']}"
            + (f" (had step {x['had']})" if "had" in x else "")
            + (f" in {x['total_s'] * 1e3:.0f} ms" if "total_s" in x else "")
            + (f" (grow {x['grow_s'] * 1e3:.0f} ms)" if "grow_s" in x else "") for x in out["recoveries"])
            + (f"; step {KILL_STEP} done {out['after_kill_s'] * 1e3:.0f} ms after the kill" if r < 4 else ""))
        if r < 4:
            want = [(CUT_STEP, [1], [], 3), (KILL_STEP, [1], [], 2), (JOIN_STEP + 1, [], [2, 3], 4)]
            if got != want:
                fails.append(f"rank {r}: recoveries {got}, want {want}")
            if out["after_kill_s"] > 1.0:
                fails.append(f"rank {r}: step {KILL_STEP} completed {out['after_kill_s']:.2f} s after the kill")
            skip = []
        else:
            if out["first"] != JOIN_STEP + 1 or got != [(JOIN_STEP + 1, [], [out["rank"]], 4)]:
                fails.append(f"replacement {r}: began at step {out['first']}, recoveries {got}")
            skip = range(JOIN_STEP + 1)
        if out["world"] != 4:
            fails.append(f"rank {r} ended in a world of {out['world']}")
        fails += harness.loss_mismatches(f"rank {r}", out["losses"], ref_losses, 1e-5, skip=skip)
        for i, (a, b) in enumerate(zip(out["params"], ref_params)):
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
                fails.append(f"rank {r}: parameter {i} differs from the fault-free run by "
                             f"{(a - b).abs().max().item():.3g}")
        for red, shard_bytes in ([out["redundancy"][:2], out["redundancy"][2:]] if r < 4 else []):
            print(f"rank {r}: redundancy {red}")
            if (red["generations"], red["snapshots"], red["copies"]) != (2, 2 * shard_bytes, 2 * shard_bytes):
                fails.append(f"rank {r}: redundancy {red}, one generation's shard state {shard_bytes} B")
    assert not fails, "\n".join(fails)


def _neighbours_lost(comm):
    import torch

    import ringcomm
    from ringcomm.parallel import ElasticZeroDataParallel, ZeroDataParallel

    torch.set_num_threads(1)
    ctx = harness.context()
    r = comm.rank
    z = ZeroDataParallel(elastic_dp.make_model(), comm, stage=3, optimizer_class=torch.optim.AdamW, lr=LR)
    el = ElasticZeroDataParallel(z, elastic_dp.batch_of)

    def loss_fn(zz, x, y):
        if el.step == 2:
            if r in (1, 2):
                ctx.store.set(f"dying/{r}", "1")
                os.kill(os.getpid(), signal.SIGKILL)
            ctx.store.wait(["dying/1", "dying/2"], timedelta(seconds=60))
            time.sleep(0.3)  # both are gone before the survivors' next call
        return elastic_dp.mse(zz, x, y)

    t0 = None
    try:
        while el.step < 4:
            t0 = time.monotonic()
            el.train_step(loss_fn)
    except ringcomm.RingcommError as e:
        return {"error": str(e), "type": type(e).__name__, "s": time.monotonic() - t0, "step": el.step}
    return {"error": None}


def test_zero_neighbours_lost_together_is_a_clear_error():
    res = harness.survivors_of(_neighbours_lost, 4, [1, 2], comm_timeout=30, hard_timeout=120, grace=40)
    errors = {r: res[r]["error"] for r in (0, 3)}
    for r in (0, 3):
        print(f"rank {r}: {res[r]}")
        err = res[r]["error"]
        assert err is not None and "shards of rank 1 and their only copy (on rank 2" in err, errors
        assert "restart from a checkpoint" in err, err
        assert res[r]["s"] < 10, res[r]
    assert errors[0] == errors[3], errors
