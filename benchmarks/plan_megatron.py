"""The planner (ringcomm.parallel.plan) against published training runs.

    python benchmarks/plan_megatron.py [--gemm-efficiency 0.7] [--memory-passes 2] [--out FILE]

1. Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
   Clusters Using Megatron-LM", SC'21), Table 1: ten GPT models on DGX A100 nodes
   (sequence 2048, vocabulary 51,200, activation recompute, no ZeRO), each at the
   tensor x pipeline size, GPU count and batch the paper gives, with its achieved
   TFLOP/s per GPU (counting the recompute's forward, as the paper does). For each
   row: the planner's prediction of that layout (micro-batch chosen by the planner,
   recompute on, ZeRO 0, no interleaving), its error against the paper, and the
   planner's own pick for that model and GPU count with its prediction.
2. The 175B / 64 A100 (80 GB) case: what the planner picks, and PP 8 x TP 4 x DP 2.

One set of efficiency parameters for every row: the cluster preset dgx-a100-ib200
(sourced in ringcomm/bench/simulate.py), peak 312 dense TFLOP/s and 2039 GB/s of
memory (A100 80 GB SXM datasheet), one achieved-GEMM fraction (--gemm-efficiency) and
the passes over a layer's activations of its memory-bound work (--memory-passes), the
data-parallel reduction after the backward (Megatron-LM of 2021; --dp-overlap 1 puts
it under the backward). The defaults were chosen by a grid search over these ten rows
(fraction 0.55-0.8 by 0.05, passes 0, 2, 4, 6, 8, 10, 12, 16, overlap off / on; the
least worst error): a fit of two numbers to ten points.
"""
import argparse
import sys

from ringcomm.parallel.planner import Cluster, Transformer, plan

# heads, hidden, layers, tp, pp, GPUs, batch, published TFLOP/s per GPU (Narayanan et al. 2021, Table 1)
TABLE1 = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SEQ, VOCAB = 2048, 51200


def a100(gpus, eff, passes):
    return Cluster(nodes=gpus // 8, devices_per_node=8, device_memory_gb=80, peak_tflops=312,
                   preset="dgx-a100-ib200", gemm_efficiency=eff, memory_gbps=2039, memory_passes=passes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm-efficiency", type=float, default=0.7)
    ap.add_argument("--memory-passes", type=float, default=2.0)
    ap.add_argument("--dp-overlap", type=int, default=0, help="1: the DP reduction under the backward")
    ap.add_argument("--out")
    args = ap.parse_args()
    lines = [f"# python benchmarks/plan_megatron.py --gemm-efficiency {args.gemm_efficiency} --memory-passes "
             f"{args.memory_passes:g} --dp-overlap {args.dp_overlap}",
             f"# preset dgx-a100-ib200, peak 312 TFLOP/s, 2039 GB/s, achieved-GEMM fraction {args.gemm_efficiency}, "
             f"memory passes {args.memory_passes:g}; "
             "TFLOP/s per GPU counting the recompute forward (hardware FLOPs), as the paper",
             f"{'model':>7} {'params':>7} {'GPUs':>5} {'batch':>5} | {'published layout':>17} {'paper':>6} "
             f"{'predicted':>9} {'error':>6} | planner's pick (its prediction)"]
    worst = 0.0
    for name, heads, hidden, layers, tp, pp, gpus, batch, published in TABLE1:
        model = Transformer(layers=layers, hidden=hidden, heads=heads, seq_len=SEQ, vocab=VOCAB)
        cluster = a100(gpus, args.gemm_efficiency, args.memory_passes)
        given = [lay for lay in plan(model, cluster, batch, tp=tp, pp=pp, zero_stage=0, recompute=True,
                                           dp_overlap=bool(args.dp_overlap), runtime="megatron") if lay.fits]
        if not given:
            lines.append(f"{name:>7}: the published layout does not fit by the planner's memory model")
            continue
        g = given[0]
        err = g.hardware_tflops_per_device / published - 1
        worst = max(worst, abs(err))
        pick = plan(model, cluster, batch, dp_overlap=bool(args.dp_overlap), runtime="megatron")[0]  # same assumptions
        lines.append(
            f"{name:>7} {model.params() / 1e9:6.1f}B {gpus:5d} {batch:5d} | tp {tp} pp {pp:>2} b {g.micro_batch:>2}"
            f" {published:6.0f} {g.hardware_tflops_per_device:9.1f} {err:+6.1%} | tp {pick.tp} pp {pick.pp} dp "
            f"{pick.dp} ZeRO {pick.zero_stage} b {pick.micro_batch} recompute {pick.recompute}: "
            f"{pick.hardware_tflops_per_device:.1f} hardware / {pick.tflops_per_device:.1f} model TFLOP/s, "
            f"{pick.step_seconds / g.step_seconds:.2f}x the published layout's predicted step")
    lines.append(f"# worst |error| of the published layouts' predictions: {worst:.1%}")
    # The classic 175B case.
    gpt3 = Transformer(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=VOCAB)
    cluster = a100(64, args.gemm_efficiency, args.memory_passes)
    layouts = plan(gpt3, cluster, 1536, runtime="deepspeed")
    lines.append("# (the 175B case below plans for DeepSpeed -- the config compared is DeepSpeed's -- with the "
                 "data-parallel reduction under the backward, dp_overlap on; ringcomm's own runtime last)")
    lines.append(f"# GPT-3 175B ({gpt3.params() / 1e9:.1f}B parameters), 64 A100 80 GB, batch 1536: "
                 f"{sum(lay.fits for lay in layouts)} of {len(layouts)} layouts fit")
    lines.append("pick:     " + layouts[0].describe())
    classic = [lay for lay in plan(gpt3, cluster, 1536, tp=4, pp=8, runtime="deepspeed") if lay.fits]
    if classic:
        lines.append("PP8xTP4xDP2 (best micro-batch / ZeRO / recompute): " + classic[0].describe())
    for zero in (0, 1):
        c = [lay for lay in plan(gpt3, cluster, 1536, tp=4, pp=8, zero_stage=zero, runtime="deepspeed")]
        lines.append(f"PP8xTP4xDP2 ZeRO {zero}: " + c[0].describe())
    own = plan(gpt3, cluster, 1536)
    lines.append("ringcomm's runtime (Pipeline over stage_bounds, ZeRO 2/3 accumulating under no_sync, "
                 f"embedding and head whole on every TP rank), {sum(lay.fits for lay in own)} fit; pick: "
                 + own[0].describe())
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
