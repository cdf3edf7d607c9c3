"""Train a small transformer with tensor, pipeline and data parallelism on ringcomm.

    torchrun --nproc-per-node 4 examples/train_3d.py --tp 2 --pp 2          # dp = 4 / (2*2) = 1
    torchrun --nproc-per-node 4 examples/train_3d.py --tp 1 --pp 2 --check  # dp = 2, vs dense
    torchrun --nproc-per-node 4 examples/train_3d.py --tp 2 --pp 1 --zero 3 # ZeRO-3 over dp = 2

Every rank builds the same dense model (same seed), keeps its pipeline stage's
slice of it, shards that slice's blocks over its tensor-parallel group
(tensor_parallel) and wraps it in DataParallel over its data-parallel group (with
--zero 1|2|3 in ZeroDataParallel, which also owns the sharded optimizer); a
Pipeline over the pipeline group runs the micro-batches. The data is a synthetic
language (arithmetic progressions modulo the vocabulary), so the loss falls fast.
With --check every rank also trains the dense model on the whole batch and the
losses are compared: 3D training computes the same thing, up to rounding.
"""
import argparse
import copy
import sys
import time

import torch

import ringcomm
from ringcomm.parallel import (DataParallel, Pipeline, ZeroDataParallel, clip_grad_norm_, split_3d,
                               tensor_parallel)
from ringcomm.parallel import models

DEFAULTS = dict(vocab=32, hidden=32, heads=4, layers=4, seq=16, batch=8, microbatches=2,
                steps=20, lr=3e-3, seed=0, schedule="1f1b", clip=None)


def make_dense(cfg):
    torch.manual_seed(cfg["seed"])
    return models.init_scale(models.transformer(cfg["vocab"], cfg["hidden"], cfg["heads"],
                                                cfg["layers"], cfg["seq"]))


def global_batch(step, cfg):
    """[batch, seq] inputs and next-token targets of progressions start + stride * t (mod vocab)."""
    g = torch.Generator().manual_seed(1000 + step)
    b, v = cfg["batch"], cfg["vocab"]
    start = torch.randint(0, v, (b, 1), generator=g)
    stride = torch.randint(1, 4, (b, 1), generator=g)
    seq = (start + stride * torch.arange(cfg["seq"] + 1)) % v
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def train(comm, tp=1, pp=1, dp=None, check=False, log=None, zero=0, mixed_precision=None,
          report=None, **overrides):
    """Trains on `comm` with the (tp, pp, dp) layout; returns the global mean loss of each
    step (on every rank) and, with check=True, the dense model's losses too. zero=1, 2, 3:
    ZeroDataParallel of that stage over the DP communicator instead of DataParallel (with
    mixed_precision="bf16" computing in bf16). With check=True and a dict `report`,
    report["param_diff"] is the largest difference between this rank's final parameters
    and the dense model's, sharded the same way. clip=C clips the gradients to global norm
    C (over the whole 3D model, ringcomm.parallel.clip) before each step, and the dense
    model's with torch.nn.utils.clip_grad_norm_; report["norms"] / report["ref_norms"]
    are then the global norms of each step before clipping.

    With report={"measure": True} every step starts at a barrier of comm, and report gets
    "step_s" (each step's time, the slowest rank's), "peak_bytes" (this rank's largest
    C-heap bytes in use during step 1 above what it held before building the model:
    ringcomm.bench.heap) and "wait_s" (the pipeline's time waiting on its neighbours in
    each step: the bubble and the transfers)."""
    cfg = {**DEFAULTS, **overrides}
    measure = report is not None and report.get("measure", False)
    if measure:
        import gc

        from ringcomm.bench.heap import HeapPeak, heap_in_use
        gc.collect()  # what an earlier run left in reference cycles goes now, not during the steps
        baseline = heap_in_use()
    g = split_3d(comm, tp=tp, pp=pp, dp=dp)
    if cfg["batch"] % (g.dp_size * cfg["microbatches"]):
        raise ValueError("batch must divide by dp * microbatches")
    dense = make_dense(cfg)
    start, end = models.stage_bounds(cfg["layers"], g.pp_size)[g.pp_rank]
    stage = copy.deepcopy(dense[start:end])
    if g.tp_size > 1:
        stage = tensor_parallel(stage, g.tp)
    if zero:
        model = opt = ZeroDataParallel(stage, g.dp, stage=zero, optimizer_class=torch.optim.AdamW,
                                       mixed_precision=mixed_precision, lr=cfg["lr"],
                                       weight_decay=0.0)
    else:
        model = DataParallel(stage, g.dp)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
        model.attach_optimizer(opt)
    pipe = Pipeline(model, g.pp, cfg["schedule"], cfg["microbatches"], loss_fn=models.lm_loss)
    ref_opt = torch.optim.AdamW(dense.parameters(), lr=cfg["lr"], weight_decay=0.0) if check else None
    if not check:
        del dense  # the stage is a copy: keep only what this rank trains
    probe = HeapPeak(stage, baseline) if measure else None
    step_s, wait_s = [], []

    per_rank = cfg["batch"] // g.dp_size
    rows = slice(g.dp_rank * per_rank, (g.dp_rank + 1) * per_rank)
    losses, ref_losses, norms, ref_norms = [], [], [], []
    for step in range(cfg["steps"]):
        tokens, targets = global_batch(step, cfg)
        if measure:
            comm.barrier()
            if step == 1:
                gc.collect()
                probe.arm()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        mb = pipe.step(tokens[rows], targets[rows])
        if cfg["clip"] is not None:
            if zero:
                norm = model.clip_grad_norm_(cfg["clip"], groups=g)
            else:
                model.finish()  # the data-parallel reduction, before the norm
                norm = clip_grad_norm_(model.parameters(), cfg["clip"], groups=g)
            norms.append(float(norm))
        opt.step()  # waits for the data-parallel reduction first (attach_optimizer, or ZeRO's step)
        loss = torch.zeros(1)
        if pipe.is_last:
            loss[0] = torch.stack(mb).mean()
            g.dp.all_reduce(loss, op="avg")
        g.pp.broadcast(loss, src=g.pp_size - 1)
        if measure:
            step_s.append(time.perf_counter() - t0)
            wait_s.append(pipe.stats["wait_s"])
            probe.disarm()
        losses.append(float(loss))
        if check:
            ref_opt.zero_grad(set_to_none=True)
            ref = models.lm_loss(dense(tokens), targets)
            ref.backward()
            if cfg["clip"] is not None:
                ref_norms.append(float(torch.nn.utils.clip_grad_norm_(dense.parameters(), cfg["clip"])))
            ref_opt.step()
            ref_losses.append(ref.item())
        if log:
            extra = f"  dense {ref_losses[-1]:.5f}" if check else ""
            log(f"step {step:3d}  loss {losses[-1]:.5f}{extra}  "
                f"({(time.perf_counter() - t0) * 1e3:.1f} ms)")
    if report is not None:
        report["norms"], report["ref_norms"] = norms, ref_norms
    if measure:
        probe.remove()
        slowest = torch.tensor(step_s, dtype=torch.float64)
        comm.all_reduce(slowest, op="max")
        report["step_s"], report["wait_s"], report["peak_bytes"] = slowest.tolist(), wait_s, probe.peak
    if check and report is not None:
        want = copy.deepcopy(dense[start:end])
        if g.tp_size > 1:
            want = tensor_parallel(want, g.tp)
        got = model.full_parameters() if zero else [p.detach() for p in stage.parameters()]
        report["param_diff"] = max((a.float() - b.detach().float()).abs().max().item()
                                   for a, b in zip(got, want.parameters()))
    g.close()
    return losses, ref_losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=None, help="default: world size / (tp * pp)")
    ap.add_argument("--schedule", choices=("1f1b", "gpipe"), default=DEFAULTS["schedule"])
    for key in ("steps", "microbatches", "batch", "layers", "hidden", "heads", "seq", "vocab"):
        ap.add_argument(f"--{key}", type=int, default=DEFAULTS[key])
    ap.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    ap.add_argument("--clip", type=float, default=None,
                    help="clip the gradients to this global norm (over the whole 3D model)")
    ap.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                    help="ZeRO stage over the data-parallel group (0: DataParallel)")
    ap.add_argument("--bf16", action="store_true",
                    help="with --zero: bf16 compute, fp32 master weights and optimizer state")
    ap.add_argument("--check", action="store_true",
                    help="also train the dense model on every rank and compare the losses")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    comm = ringcomm.init()
    log = print if comm.rank == 0 else None
    if log:
        dp = args.dp or comm.world_size // (args.tp * args.pp)
        log(f"world {comm.world_size}: tp {args.tp} x pp {args.pp} x dp {dp}, {args.schedule}, "
            f"{args.microbatches} micro-batches"
            f"{f', ZeRO stage {args.zero}' if args.zero else ''}")
    cfg = {k: getattr(args, k) for k in ("steps", "microbatches", "batch", "layers", "hidden",
                                         "heads", "seq", "vocab", "lr", "schedule", "clip")}
    if args.bf16 and not args.zero:
        ap.error("--bf16 needs --zero")
    losses, ref = train(comm, args.tp, args.pp, args.dp, check=args.check, log=log, zero=args.zero,
                        mixed_precision="bf16" if args.bf16 else None, **cfg)
    status = 0
    if log:
        log(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if args.check:
            worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, ref))
            log(f"largest relative difference from dense training: {worst:.2e}")
            status = 0 if worst < (3e-2 if args.bf16 else 1e-3) else 1
    ringcomm.finalize()
    return status


if __name__ == "__main__":
    sys.exit(main())
