"""Watch a data-parallel job survive the loss of a rank and take a replacement.

    python examples/elastic_dp.py                        # 4 ranks, shared memory
    python examples/elastic_dp.py --transport tcp --kill-step 5 --join-step 9
    python examples/elastic_dp.py --zero 3               # ZeRO-3: shards kept on the next rank too

This launcher serves the rendezvous store itself (a TCPStore that outlives the
workers, as torchrun's agent does) and starts --world worker processes that
train a small MLP with ringcomm.parallel.ElasticDataParallel on a fixed
global batch per step. At --kill-step it SIGKILLs worker 2 in the middle of
that step; the survivors recover (revoke, shrink, agree on the last completed
step) and redo the step on the smaller world. At --join-step it starts a
replacement process, which the members admit at the end of that step (it
receives the parameters and optimizer state). Rank 0 prints every step: the
world size, the loss, and the loss of the same model trained on one process
(the fault-free run), which must match.
"""
import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
from datetime import timedelta

BATCH = 24
JOB = "elastic-example"


def make_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def batch_of(step):
    import torch

    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)


def mse(model, x, y):
    import torch

    return torch.nn.functional.mse_loss(model(x), y)


def reference(steps):
    """The fault-free run: the whole global batch on one process."""
    import torch

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = mse(model, *batch_of(step))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _store(port):
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))


def worker(rank, world, port, args, replacement):
    import torch

    import ringcomm
    from ringcomm.parallel import DataParallel, ElasticDataParallel, ElasticZeroDataParallel, ZeroDataParallel

    torch.set_num_threads(1)
    os.environ["RINGCOMM_TRANSPORT"] = args.transport
    store = _store(port)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if replacement:
        if not args.replace_at_kill:
            store.wait([f"done/{args.join_step - 1}"], timedelta(seconds=args.timeout))
        if args.zero:
            el = ElasticZeroDataParallel.join(model, batch_of, store=store, job=JOB, timeout=60)
        else:
            el = ElasticDataParallel.join(model, opt, batch_of, store=store, job=JOB, timeout=60)
        print(f"[replacement] admitted as rank {el.comm.rank} of {el.comm.world_size}, from step {el.step}",
              flush=True)
    else:
        comm = ringcomm.init(rank=rank, world_size=world, store=store, timeout=60)
        if args.zero:  # the same optimizer, its state sharded (and each shard kept on the next rank too)
            z = ZeroDataParallel(model, comm, stage=args.zero, optimizer_class=torch.optim.SGD, lr=0.05,
                                 momentum=0.9)
            el = ElasticZeroDataParallel(z, batch_of, job=JOB)
        else:
            el = ElasticDataParallel(DataParallel(model, comm), opt, batch_of, job=JOB)
    ref = reference(args.steps)
    seen = len(el.recoveries)
    while el.step < args.steps:
        store.set(f"started/{el.step}/{os.getpid()}", "1")
        time.sleep(args.step_time)  # the rest of a real step's work
        if el.step == args.join_step and el.comm.rank == 0 and not replacement and not args.replace_at_kill:
            # For the demonstration only: the replacement (still importing torch,
            # perhaps) is admitted at exactly --join-step. A real job admits
            # whoever waits at the end of any step, and waits for nobody.
            from ringcomm import recovery

            until = time.monotonic() + 60
            while recovery.waiting(store, JOB) < 1 and time.monotonic() < until:
                time.sleep(0.01)
        t0 = time.monotonic()
        loss = el.train_step(mse)
        step = el.step - 1
        for rec in el.recoveries[seen:]:
            if el.comm.rank == 0 and rec.get("joined"):
                print(f"  -> after step {rec['step'] - 1}: admitted ranks {rec['joined']}, world now "
                      f"{rec['world']}, {rec['total_s'] * 1e3:.0f} ms", flush=True)
            elif el.comm.rank == 0:
                print(f"  -> during step {rec['step']}: lost ranks {rec['lost']}, world now {rec['world']}, "
                      f"recovered in {rec['total_s'] * 1e3:.0f} ms; the step is redone", flush=True)
        seen = len(el.recoveries)
        if el.comm.rank == 0:
            print(f"step {step:3d}  world {el.last_world}  loss {loss:.6f}  fault-free {ref[step]:.6f}  "
                  f"{(time.monotonic() - t0) * 1e3:6.1f} ms", flush=True)
            store.set(f"done/{step}", "1")
            store.set(f"report/{step}", f"{time.time()!r} {el.last_world}")
        if abs(loss - ref[step]) > 1e-5 * abs(ref[step]):
            print(f"rank {el.comm.rank}: step {step} loss {loss} differs from the fault-free {ref[step]}",
                  file=sys.stderr, flush=True)
            sys.exit(1)
    el.comm.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kill-step", type=int, default=7)
    ap.add_argument("--join-step", type=int, default=12, help="-1: no replacement")
    ap.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    ap.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                    help="ZeroDataParallel of this stage (ElasticZeroDataParallel) instead of DataParallel")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds of other work per step")
    ap.add_argument("--replace-at-kill", action="store_true",
                    help="start the replacement right after the kill; it is admitted once it is up")
    ap.add_argument("--report", help="write the kill time and each step's completion (JSON) here")
    ap.add_argument("--timeout", type=float, default=120.0, help="the whole run, in seconds")
    args = ap.parse_args()
    if not 0 <= args.kill_step < args.steps or args.world < 3:
        ap.error("need --world >= 3 and 0 <= --kill-step < --steps")

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, args.world, store.port, args, False)) for r in range(args.world)]
    for p in procs:
        p.start()
    victim = procs[2]
    joiner = None
    deadline = time.monotonic() + args.timeout
    # Kill worker 2 once it has begun the kill step (it is computing or reducing).
    while not store.check([f"started/{args.kill_step}/{victim.pid}"]):
        if time.monotonic() > deadline or not victim.is_alive():
            break
        time.sleep(0.001)
    time.sleep(0.002)
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    print(f"[launcher] SIGKILLed worker 2 (pid {victim.pid}) during step {args.kill_step}", flush=True)
    if args.replace_at_kill:
        joiner = ctx.Process(target=worker, args=(-1, 0, store.port, args, True))
        joiner.start()
        print(f"[launcher] started a replacement (pid {joiner.pid}) at the kill", flush=True)
        procs.append(joiner)
    elif 0 < args.join_step < args.steps - 1:
        # Started now (importing torch takes seconds); it asks to join after step join_step - 1.
        joiner = ctx.Process(target=worker, args=(-1, 0, store.port, args, True))
        joiner.start()
        print(f"[launcher] started a replacement (pid {joiner.pid}); it asks to join after step "
              f"{args.join_step - 1}", flush=True)
        procs.append(joiner)
    status = 0
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            status = 1
            print(f"[launcher] pid {p.pid} did not finish within --timeout", file=sys.stderr)
        elif p is not victim and p.exitcode != 0:
            status = 1
    if args.report:
        import json

        steps = {}
        for s in range(args.steps):
            if store.check([f"report/{s}"]):
                t, world = store.get(f"report/{s}").decode().split()
                steps[s] = [float(t), None if world == "None" else int(world)]
        with open(args.report, "w") as f:
            json.dump({"killed_at": killed_at, "kill_step": args.kill_step, "steps": steps}, f)
    print("[launcher] done" if status == 0 else "[launcher] FAILED", flush=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
