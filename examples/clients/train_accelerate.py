"""accelerate 1.15 on the "ringcomm" backend, 2 CPU processes:

    torchrun --nproc-per-node 2 examples/clients/train_accelerate.py --out OUT
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no examples/clients/train_accelerate.py --out OUT

On CPU processes accelerate picks the backend itself (MPI if torch has it,
else gloo) and refuses any other in InitProcessGroupKwargs(backend=...) ("Your
assigned backend ringcomm is not available, please use gloo"). It does use a
default process group that already exists (PartialState initialises one only
when torch.distributed.is_initialized() is false), so the program makes the
ringcomm group first and then builds Accelerator(cpu=True): cpu=True (or
ACCELERATE_USE_CPU=1, which `accelerate launch --cpu` sets) is what makes
accelerate treat the processes as one multi-CPU job; without it, on a machine
with no GPU, it would run each process as a job of its own. accelerate keeps
calling the backend "gloo" (state.backend is its label for multi-CPU jobs);
torch.distributed.get_backend() says what runs. With --backend gloo the
program leaves the initialisation to accelerate, as stock accelerate does.
"""
import torch
import torch.distributed as dist
from accelerate import Accelerator

import common


def main():
    args = common.parser(__doc__.splitlines()[0], ["ddp"]).parse_args()
    torch.set_num_threads(1)
    if args.backend != "gloo":
        dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_* from the launcher
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    model = common.mlp(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = accelerator.prepare(model, opt)
    timer, losses, mean_losses = common.StepTimer(), [], []
    for step in range(args.steps):
        timer.start()
        x, y = common.batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
        timer.stop()
        losses.append(loss.item())
        mean_losses.append(accelerator.gather(loss.detach()[None]).mean().item())  # all_gather
    params = list(accelerator.unwrap_model(model).parameters())
    common.write(args.out, rank, backend=dist.get_backend(), losses=losses, params=params,
                 step_times=timer.times, mean_losses=mean_losses, group=type(dist.group.WORLD).__name__,
                 accelerate_backend=accelerator.state.backend, num_processes=accelerator.num_processes,
                 distributed_type=str(accelerator.distributed_type))
    accelerator.end_training()


if __name__ == "__main__":
    main()
