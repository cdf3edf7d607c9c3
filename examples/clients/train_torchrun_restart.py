"""torchrun elastic restarts with DDP on the "ringcomm" backend, 2 CPU processes:

    torchrun --nproc-per-node 2 --max-restarts 2 examples/clients/train_torchrun_restart.py --out OUT

DDP trains the examples' MLP; rank 0 checkpoints model and optimizer after every
step (atomically, OUT/ckpt.pt). On the first attempt rank 1 SIGKILLs itself in step
--kill-step, before its backward (OUT/killed_at holds the time): rank 0 is then in
DDP's gradient all_reduce with a peer gone. It must raise (ringcomm names the lost
rank), not crash: it writes OUT/attempt0_rank0.txt with what it raised before it
exits. torchrun then restarts both workers; they resume from the checkpoint and
finish. Each rank's results hold every step's loss (the resumed ones from the
checkpoint) and restart_s, the time from the kill to the restarted group's first
step.
"""
import os
import signal
import time
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import common


def main():
    ap = common.parser(__doc__.splitlines()[0], ["ddp"])
    ap.add_argument("--kill-step", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    model = common.mlp(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = os.path.join(args.out, "ckpt.pt")
    start, losses = 0, []
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start, losses = state["step"], state["losses"][rank]
    ddp = DDP(model)
    timer, restart_s = common.StepTimer(), None
    try:
        for step in range(start, args.steps):
            if restart_s is None and attempt > 0:
                with open(os.path.join(args.out, "killed_at")) as f:
                    restart_s = time.time() - float(f.read())
            timer.start()
            x, y = common.batch(step, rank)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            if attempt == 0 and rank == 1 and step == args.kill_step:
                with open(os.path.join(args.out, "killed_at.tmp"), "w") as f:
                    f.write(repr(time.time()))
                os.replace(os.path.join(args.out, "killed_at.tmp"), os.path.join(args.out, "killed_at"))
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            loss.backward()  # DDP's all_reduce of the gradients
            opt.step()
            timer.stop()
            losses.append(loss.item())
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, losses)
            if rank == 0:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step + 1,
                            "losses": gathered}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            dist.barrier()  # the checkpoint is on disk before anyone goes on
    except Exception as e:
        with open(os.path.join(args.out, f"attempt{attempt}_rank{rank}.txt"), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        raise
    survivor = os.path.join(args.out, "attempt0_rank0.txt")
    raised = open(survivor).read() if os.path.exists(survivor) else None
    common.write(args.out, rank, backend=dist.get_backend(), losses=losses, params=list(model.parameters()),
                 step_times=timer.times, group=type(dist.group.WORLD).__name__, attempt=attempt,
                 restart_s=restart_s, survivor_raised=raised)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
