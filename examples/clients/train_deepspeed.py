"""DeepSpeed 0.19 on the "ringcomm" backend, 2 CPU processes:

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 examples/clients/train_deepspeed.py --variant zero2 --out OUT

deepspeed.init_distributed(dist_backend=--backend) hands the name to
init_process_group; then a few deepspeed.comm collectives are checked against
their expected values, and the MLP trains under ZeRO stage 1 or 2
(--variant zero1 / zero2). DS_ACCELERATOR=cpu selects DeepSpeed's CPU
accelerator (on a machine without a GPU it falls back to it anyway, with a
warning). No DeepSpeed op is built: the optimizer is torch's SGD
("zero_allow_untested_optimizer"); DeepSpeedCPUAdam would be compiled on first
use (ninja and a C++ compiler at run time).
"""
import torch

import deepspeed
import deepspeed.comm as dist

import common


def comm_checks(rank, ws):
    """deepspeed.comm's collectives over the backend; returns failure strings."""
    fails = []

    def check(ok, what):
        if not ok:
            fails.append(f"rank {rank}: deepspeed.comm {what}")

    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    check(x.tolist() == [ws * (ws + 1) / 2] * 5, f"all_reduce gave {x.tolist()}")
    out = torch.empty(ws * 3)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
    check(out.tolist() == [float(r) for r in range(ws) for _ in range(3)], f"all_gather_into_tensor {out.tolist()}")
    part = torch.empty(2)
    dist.reduce_scatter_tensor(part, torch.arange(2.0 * ws))
    check(part.tolist() == [ws * (2.0 * rank), ws * (2.0 * rank + 1)], f"reduce_scatter_tensor {part.tolist()}")
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=ws - 1)
    check(b.tolist() == [float(ws - 1)] * 4, f"broadcast {b.tolist()}")
    a2a = torch.empty(ws)
    dist.all_to_all_single(a2a, torch.full((ws,), float(rank)))
    check(a2a.tolist() == [float(r) for r in range(ws)], f"all_to_all_single {a2a.tolist()}")
    dist.barrier()
    return fails


def main():
    args = common.parser(__doc__.splitlines()[0], ["zero1", "zero2"]).parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend=args.backend)
    rank, ws = dist.get_rank(), dist.get_world_size()
    fails = comm_checks(rank, ws)
    config = {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": int(args.variant[-1])},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
    }
    model = common.mlp(args.width)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                           config=config)
    timer, losses = common.StepTimer(), []
    for step in range(args.steps):
        timer.start()
        x, y = common.batch(step, rank)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        timer.stop()
        losses.append(loss.item())
    import torch.distributed as tdist

    common.write(args.out, rank, backend=tdist.get_backend(), losses=losses, params=list(engine.module.parameters()),
                 step_times=timer.times, comm_failures=fails, group=type(tdist.group.WORLD).__name__)
    engine.destroy()
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
