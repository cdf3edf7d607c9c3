"""Training on the "ringcomm" torch.distributed backend ends where gloo ends.

Each rank trains the same small models twice, once over the ringcomm default
group and once over a gloo group of the same ranks, from the same
initialisation and data: DDP (plain, and with small buckets + a comm hook,
which drives Work.get_future()), FSDP2 fully_shard, and a 2-stage
torch.distributed.pipelining schedule. One spawned group per world size.
"""

from datetime import timedelta

import pytest

import harness

STEPS = 20


def _mlp(seed):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(step, rank, n=16):
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


def _ddp(group, hook=False):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = harness.context().rank
    # Different initial weights per rank: DDP's broadcast makes them equal.
    model = DDP(_mlp(seed=rank), process_group=group,
                bucket_cap_mb=0.001 if hook else 25)  # tiny buckets: one future per layer
    if hook:
        model.register_comm_hook(group, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def _fsdp2(mesh):
    import torch
    from torch.distributed.fsdp import fully_shard

    rank = harness.context().rank
    model = _mlp(seed=7)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.full_tensor().detach().clone() for p in model.parameters()], losses


def _pipeline(group, schedule_cls):
    """Stages 0 and 1 on ranks 0 and 1 of `group`; returns this rank's losses and grads."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    rank = dist.get_rank(group)
    full = _mlp(seed=11)
    part = full[:2] if rank == 0 else full[2:]
    stage = PipelineStage(part, rank, 2, torch.device("cpu"), group=group)
    sched = schedule_cls(stage, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
    x, y = _batch(0, 0, n=16)
    losses = []
    if rank == 0:
        sched.step(x)
    else:
        sched.step(target=y, losses=losses)
    return [p.grad.detach().clone() for p in part.parameters()], [v.item() for v in losses]


def _compare(fails, what, got, ref, rtol=1e-5, atol=1e-6):
    import torch

    params, losses = got
    ref_params, ref_losses = ref
    if len(losses) != len(ref_losses) or not torch.allclose(torch.tensor(losses), torch.tensor(ref_losses),
                                                            rtol=rtol, atol=atol):
        fails.append(f"{what}: losses {losses[:4]}... differ from gloo's {ref_losses[:4]}...")
    if len(params) != len(ref_params):
        fails.append(f"{what}: {len(params)} parameters, gloo {len(ref_params)}")
    for i, (a, b) in enumerate(zip(params, ref_params)):
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            fails.append(f"{what}: parameter {i} differs from gloo's by {(a - b).abs().max().item():.3g}")


def _train(comm):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    import ringcomm.torch_backend  # noqa: F401

    torch.set_num_threads(1)
    ctx = harness.context()
    dist.init_process_group("ringcomm", store=ctx.store, rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    fails = []

    ref = _ddp(gloo)
    _compare(fails, "DDP", _ddp(None), ref)
    _compare(fails, "DDP, small buckets + allreduce comm hook", _ddp(None, hook=True), ref)

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    _compare(fails, "FSDP2 fully_shard", _fsdp2(mesh), _fsdp2(DeviceMesh.from_group(gloo, "cpu")))

    pp_rc, pp_gloo = dist.new_group([0, 1]), dist.new_group([0, 1], backend="gloo")
    if ctx.rank < 2:
        for cls in (ScheduleGPipe, Schedule1F1B):
            _compare(fails, f"pipelining {cls.__name__}", _pipeline(pp_rc, cls), _pipeline(pp_gloo, cls))
    dist.destroy_process_group()
    return fails


@pytest.mark.parametrize("world_size", (2, 3))
def test_training_matches_gloo(world_size):
    harness.assert_no_failures(harness.run_ranks(_train, world_size, init=False, hard_timeout=150))
