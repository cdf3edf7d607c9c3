"""A DataParallel job on ringcomm that recovers the classic way: torchrun
--max-restarts restarts every worker and they resume from the last checkpoint
(benchmarks/recovery_table.py measures it against in-place recovery).

    torchrun --standalone --nproc-per-node 4 --max-restarts 1 benchmarks/torchrun_restart_worker.py --dir D

Rank 0 saves model and optimizer every --ckpt-every steps (atomically) and
appends "step time attempt world" to D/log.txt for each completed step; on
its first attempt worker --kill-rank SIGKILLs itself in the middle of step
--kill-step (D/killed_at holds the time). The same model, data and optimizer
as examples/elastic_dp.py.
"""
import argparse
import os
import signal
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import elastic_dp  # noqa: E402  (the model, batches and loss of the in-place recovery example)

import ringcomm  # noqa: E402
from ringcomm.parallel import DataParallel  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kill-step", type=int, default=7)
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--step-time", type=float, default=0.05)
    args = ap.parse_args()
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    comm = ringcomm.init(timeout=60)
    rank, world = comm.rank, comm.world_size
    model = elastic_dp.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = os.path.join(args.dir, "ckpt.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"]
    dp = DataParallel(model, comm)
    for step in range(start, args.steps):
        time.sleep(args.step_time)
        x, y = (torch.tensor_split(t, world)[rank] for t in elastic_dp.batch_of(step))
        opt.zero_grad()
        loss = elastic_dp.mse(dp, x, y)
        if attempt == 0 and rank == args.kill_rank and step == args.kill_step:
            with open(os.path.join(args.dir, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        dp.finish()
        opt.step()
        if rank == 0:
            with open(os.path.join(args.dir, "log.txt"), "a") as f:
                f.write(f"{step} {time.time()!r} {attempt} {world}\n")
            if (step + 1) % args.ckpt_every == 0:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step + 1}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
    comm.close()


if __name__ == "__main__":
    main()
