"""torch.distributed's own layers on the "ringcomm" backend, 2 CPU processes:

    torchrun --nproc-per-node 2 examples/clients/train_torch_features.py --variant VARIANT --out OUT

Variants, each training the examples' MLP (common.py) for --steps steps:
  compile        data parallel by hand: the gradients all_reduced and the losses
                 all_gathered by torch.distributed._functional_collectives inside
                 one torch.compile(fullgraph=True) function (inductor);
  dtensor        tensor parallel: parallelize_module with ColwiseParallel /
                 RowwiseParallel over a 1-D DeviceMesh (sharded matmuls, DTensor
                 redistribute Shard -> Replicate); every rank sees the same batch;
  gpipe          pipeline parallel: torch.distributed.pipelining, one stage per
                 rank, ScheduleGPipe over 4 micro-batches;
  interleaved    two stages per rank (4 in all), ScheduleInterleaved1F1B;
  dcp            FSDP2 (fully_shard) with torch.distributed.checkpoint: save after
                 half the steps, async_save (on a group of its own) at the end,
                 and load back: the loaded state must equal what was saved.
"""
import os
import shutil

import torch
import torch.distributed as dist

import common

VARIANTS = ["compile", "dtensor", "gpipe", "interleaved", "dcp"]


def data_parallel_compile(args, rank, world):
    import torch.distributed._functional_collectives as funcol

    model = common.mlp(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    group = dist.group.WORLD

    @torch.compile(fullgraph=True, backend="inductor")
    def sync(flat, loss):
        avg = funcol.all_reduce(flat, "sum", group) / world
        losses = funcol.all_gather_tensor(loss.reshape(1), 0, group)
        return avg, losses

    timer, losses, mean_losses = common.StepTimer(), [], []
    for step in range(args.steps):
        timer.start()
        x, y = common.batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        avg, gathered = sync(torch.cat([g.reshape(-1) for g in grads]), loss.detach())
        off = 0
        for g in grads:
            g.copy_(avg[off:off + g.numel()].view_as(g))
            off += g.numel()
        opt.step()
        timer.stop()
        losses.append(loss.item())
        mean_losses.append(gathered.mean().item())
    return dict(losses=losses, params=list(model.parameters()), step_times=timer.times, mean_losses=mean_losses)


def tensor_parallel(args, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    model = common.mlp(args.width)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    timer, losses = common.StepTimer(), []
    for step in range(args.steps):
        timer.start()
        x, y = common.batch(step, 0)  # the same batch on every rank: one model, split by columns / rows
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        timer.stop()
        losses.append(loss.item())
    # A sharded matmul by hand too: Shard(0) x Shard(1) -> Partial, redistributed to Replicate.
    a = torch.arange(64, dtype=torch.float32).reshape(8, 8) / 64
    da = distribute_tensor(a, mesh, [Shard(1)])
    db = distribute_tensor(a.T.contiguous(), mesh, [Shard(0)])
    prod = (da @ db).redistribute(mesh, [Replicate()]).to_local()
    checks = [] if torch.allclose(prod, a @ a.T, atol=1e-6) else [f"rank {rank}: sharded matmul differs"]
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return dict(losses=losses, params=params, step_times=timer.times, comm_failures=checks, shared_losses=True)


def pipeline(args, rank, world, interleaved):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, ScheduleInterleaved1F1B

    full = common.mlp(args.width)
    layers = list(full)  # Linear, ReLU, Linear, ReLU, Linear
    parts = ([layers[0:1], layers[1:3], layers[3:4], layers[4:5]] if interleaved else [layers[0:2], layers[2:5]])
    n_stages = len(parts)
    mine = [s for s in range(n_stages) if s % world == rank]
    stages = [PipelineStage(torch.nn.Sequential(*parts[s]), s, n_stages, torch.device("cpu")) for s in mine]
    params = [p for st in stages for p in st.submod.parameters()]
    opt = torch.optim.SGD(params, lr=0.05)
    micro_losses = []

    def loss_fn(out, target):
        return torch.nn.functional.mse_loss(out, target)

    sched = (ScheduleInterleaved1F1B(stages, n_microbatches=4, loss_fn=loss_fn) if interleaved else
             ScheduleGPipe(stages[0], n_microbatches=4, loss_fn=loss_fn))
    last = (n_stages - 1) in mine
    timer, losses = common.StepTimer(), []
    for step in range(args.steps):
        timer.start()
        x, y = common.batch(step, 0)
        opt.zero_grad()
        micro_losses = []
        if rank == 0 and last:
            sched.step(x, target=y, losses=micro_losses)
        elif rank == 0:
            sched.step(x)
        elif last:
            sched.step(target=y, losses=micro_losses)
        else:
            sched.step()
        opt.step()
        timer.stop()
        # The step's loss (the mean over micro-batches), from the last stage's rank.
        loss = torch.tensor([torch.stack(micro_losses).mean().item() if last else 0.0])
        dist.broadcast(loss, src=(n_stages - 1) % world)
        losses.append(loss.item())
    return dict(losses=losses, params=params, step_times=timer.times, shared_losses=True, own_params=True)


def checkpointing(args, rank, world):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    model = common.mlp(args.width)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    where = os.path.join(args.out, "dcp")
    timer, losses, checks = common.StepTimer(), [], []
    saved = None

    def snapshot():
        return [p.full_tensor().clone() for p in model.parameters()]

    for step in range(args.steps):
        timer.start()
        x, y = common.batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        timer.stop()
        losses.append(loss.item())
        if step == args.steps // 2 - 1:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(where, "half"))
            saved = snapshot()
    final = snapshot()
    # async_save on a group of its own (its thread's collectives never meet the training's).
    ckpt_group = dist.new_group()
    msd, osd = get_state_dict(model, opt)
    future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(where, "end"),
                            process_group=ckpt_group)
    future.result()
    for name, want in (("half", saved), ("end", final)):
        msd, osd = get_state_dict(model, opt)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=os.path.join(where, name))
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
        got = snapshot()
        if not all(torch.equal(a, b) for a, b in zip(got, want)):
            checks.append(f"rank {rank}: the state loaded from '{name}' differs from what was saved")
    return dict(losses=losses, params=final, step_times=timer.times, comm_failures=checks)


def main():
    args = common.parser(__doc__.splitlines()[0], VARIANTS).parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_* from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.variant == "compile":
        res = data_parallel_compile(args, rank, world)
    elif args.variant == "dtensor":
        res = tensor_parallel(args, rank, world)
    elif args.variant in ("gpipe", "interleaved"):
        res = pipeline(args, rank, world, args.variant == "interleaved")
    else:
        res = checkpointing(args, rank, world)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(os.path.join(args.out, "dcp"), ignore_errors=True)
    common.write(args.out, rank, backend=dist.get_backend(), group=type(dist.group.WORLD).__name__, **res)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
