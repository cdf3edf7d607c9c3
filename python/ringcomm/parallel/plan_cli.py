"""ringcomm-plan: the 3D layouts of a transformer on a cluster, fastest first
(ringcomm.parallel.plan; the formulas and their sources: planner.py).

    ringcomm-plan --layers 96 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 \\
        --nodes 8 --devices-per-node 8 --memory-gb 80 --peak-tflops 312 --preset dgx-a100-ib200 \\
        --global-batch 1536 [--tp 4 --pp 8 ...] [--top 10] [--json FILE] [--deepspeed FILE]

Prints the best --top layouts that fit (each: step time, TFLOP/s per device, the
bubble, memory per device by kind, the communication of each kind and how much of it
is hidden), the best few that do not fit with the reason, then the ringcomm calls of
the pick; --deepspeed FILE writes the pick's DeepSpeed config, --json FILE every layout.
"""
import argparse
import json
import sys

from ringcomm.parallel.planner import Cluster, Transformer, plan, to_json


def _ints(text):
    return [int(x) for x in text.split(",")]


def _bools(text):
    vals = []
    for x in text.split(","):
        if x.lower() in ("1", "true", "yes", "on"):
            vals.append(True)
        elif x.lower() in ("0", "false", "no", "off"):
            vals.append(False)
        else:
            raise argparse.ArgumentTypeError(f"not a boolean: {x!r}")
    return vals


def parser():
    ap = argparse.ArgumentParser(prog="ringcomm-plan", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    m = ap.add_argument_group("model")
    m.add_argument("--layers", type=int, required=True)
    m.add_argument("--hidden", type=int, required=True)
    m.add_argument("--heads", type=int, required=True)
    m.add_argument("--seq", type=int, required=True, help="sequence length")
    m.add_argument("--vocab", type=int, required=True)
    m.add_argument("--ffn", type=int, default=None, help="MLP width (default 4 x hidden)")
    c = ap.add_argument_group("cluster")
    c.add_argument("--nodes", type=int, required=True)
    c.add_argument("--devices-per-node", type=int, required=True)
    c.add_argument("--memory-gb", type=float, required=True, help="device memory, GB (10^9 bytes)")
    c.add_argument("--peak-tflops", type=float, required=True, help="peak dense TFLOP/s of a device")
    c.add_argument("--gemm-efficiency", type=float, default=0.5, help="achieved fraction of the peak in GEMMs")
    c.add_argument("--memory-gbps", type=float, default=0.0, help="device memory bandwidth (memory-bound work)")
    c.add_argument("--memory-passes", type=float, default=0.0,
                   help="passes over a layer's activations per forward (memory-bound work)")
    c.add_argument("--usable-fraction", type=float, default=0.9, help="of the device memory a layout may use")
    c.add_argument("--cores", type=int, default=None,
                   help="processors a node's devices share (CPU ranks; default: each device its own)")
    c.add_argument("--optimizer-ns-per-param", type=float, default=None,
                   help="the optimizer step's nanoseconds per parameter (default: Adam's 28 bytes at --memory-gbps)")
    links = c.add_mutually_exclusive_group()
    links.add_argument("--preset", help="links of a ringcomm-bench --simulate preset (e.g. dgx-a100-ib200)")
    links.add_argument("--params", help="links from a ringcomm-bench --calibrate file")
    ap.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    k = ap.add_argument_group("constraints (a value or a comma list)")
    k.add_argument("--tp", type=_ints)
    k.add_argument("--pp", type=_ints)
    k.add_argument("--dp", type=_ints)
    k.add_argument("--zero", type=_ints, dest="zero_stage")
    k.add_argument("--micro-batch", type=_ints)
    k.add_argument("--interleave", type=_ints)
    k.add_argument("--recompute", type=_bools)
    t = ap.add_argument_group("training")
    t.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    t.add_argument("--activations", choices=("megatron", "fused"), default="megatron",
                   help="megatron: Korthikanti et al.'s bytes; fused: fused attention, no dropout")
    t.add_argument("--runtime", choices=("ringcomm", "megatron", "deepspeed"), default="ringcomm")
    ap.add_argument("--max-micro-batch", type=int, default=16)
    ap.add_argument("--max-interleave", type=int, default=1)
    ap.add_argument("--no-dp-overlap", action="store_true", help="DP reductions after the backward, not under it")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--json", help="write every layout here")
    ap.add_argument("--deepspeed", help="write the pick's DeepSpeed config here")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        model = Transformer(layers=args.layers, hidden=args.hidden, heads=args.heads, seq_len=args.seq,
                            vocab=args.vocab, ffn=args.ffn)
        cluster = Cluster(nodes=args.nodes, devices_per_node=args.devices_per_node,
                          device_memory_gb=args.memory_gb, peak_tflops=args.peak_tflops, preset=args.preset,
                          params=args.params, gemm_efficiency=args.gemm_efficiency,
                          usable_fraction=args.usable_fraction, memory_gbps=args.memory_gbps,
                          memory_passes=args.memory_passes, cores=args.cores,
                          optimizer_seconds_per_param=(None if args.optimizer_ns_per_param is None
                                                       else args.optimizer_ns_per_param * 1e-9))
        constraints = {k: getattr(args, k) for k in ("tp", "pp", "dp", "zero_stage", "micro_batch", "interleave",
                                                      "recompute") if getattr(args, k) is not None}
        layouts = plan(model, cluster, args.global_batch, max_micro_batch=args.max_micro_batch,
                       max_interleave=args.max_interleave, dp_overlap=not args.no_dp_overlap,
                       precision=args.precision, activations=args.activations, runtime=args.runtime, **constraints)
    except (ValueError, TypeError, OSError) as e:
        print(f"ringcomm-plan: {e}", file=sys.stderr)
        return 2
    fit = [lay for lay in layouts if lay.fits]
    print(f"# {model}: {model.params() / 1e9:.2f}B parameters; {cluster.nodes} x {cluster.devices_per_node} "
          f"devices of {cluster.device_memory_gb:g} GB, {cluster.peak_tflops:g} TFLOP/s peak x "
          f"{cluster.gemm_efficiency:g}; links {args.preset or args.params or 'ringcomm defaults'}; "
          f"global batch {args.global_batch}")
    print(f"# {len(fit)} of {len(layouts)} layouts fit")
    for i, lay in enumerate(fit[:args.top]):
        print(f"{i + 1:3d}. {lay.describe()}")
    for lay in [lay for lay in layouts if not lay.fits][:3]:
        print(f"  x  {lay.describe()}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(to_json(layouts))
    if not fit:
        print("# no layout fits", file=sys.stderr)
        return 1
    pick = fit[0]
    print("# the pick's ringcomm calls:")
    print(pick.ringcomm_calls())
    if args.deepspeed:
        with open(args.deepspeed, "w") as f:
            json.dump(pick.deepspeed_config(), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
