"""Data-, tensor- and pipeline-parallel training on ringcomm communicators.

    from ringcomm.parallel import DataParallel, Pipeline, split_3d, tensor_parallel
    g = split_3d(comm, tp=2, pp=2)                  # this rank's TP, PP and DP communicators
    stage = tensor_parallel(dense_stage, g.tp)      # Megatron column/row split of the blocks
    model = DataParallel(stage, g.dp)               # bucketed AVG all_reduce during backward
    pipe = Pipeline(model, g.pp, "1f1b", n_microbatches=4, loss_fn=loss)
    losses = pipe.step(tokens, target); model.finish(); opt.step()

    z = ZeroDataParallel(stage, g.dp, stage=3, mixed_precision="bf16", lr=1e-3)  # ZeRO over DP
    pipe = Pipeline(z, g.pp, "1f1b", n_microbatches=4, loss_fn=loss)
    losses = pipe.step(tokens, target); z.step(); z.zero_grad()

    el = ElasticDataParallel(DataParallel(model, comm), opt, batch_of)  # survives lost DP ranks
    while el.step < steps: el.train_step(loss_fn)

    layouts = plan(Transformer(96, 12288, 96, 2048, 51200),             # which layout? (planner.py)
                   Cluster(8, 8, 80, 312, preset="dgx-a100-ib200"), global_batch=1536)
"""
from ringcomm.parallel.clip import clip_grad_norm_
from ringcomm.parallel.dp import DataParallel
from ringcomm.parallel.elastic import ElasticDataParallel
from ringcomm.parallel.elastic_3d import Elastic3D, ReplicaDropped
from ringcomm.parallel.elastic_zero import ElasticZeroDataParallel
from ringcomm.parallel.mesh import ParallelGroups, drop_lost_replicas, layout_ranks, split_3d
from ringcomm.parallel.planner import Cluster, Layout, Transformer, plan
from ringcomm.parallel.pp import Pipeline, schedule_order
from ringcomm.parallel.tp import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelAttention,
    TensorParallelBlock,
    TensorParallelMLP,
    copy_to_tp,
    gather_from_sp,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_to_sp,
    scatter_to_tp,
    split_sequence,
    sync_sequence_parallel_grads,
    tensor_parallel,
)
from ringcomm.parallel.zero import ZeroDataParallel, paper_memory_bytes

__all__ = [
    "Cluster",
    "ColumnParallelLinear",
    "DataParallel",
    "Elastic3D",
    "ElasticDataParallel",
    "ElasticZeroDataParallel",
    "Layout",
    "ParallelGroups",
    "Pipeline",
    "ReplicaDropped",
    "RowParallelLinear",
    "TensorParallelAttention",
    "TensorParallelBlock",
    "TensorParallelMLP",
    "Transformer",
    "clip_grad_norm_",
    "drop_lost_replicas",
    "copy_to_tp",
    "gather_from_sp",
    "gather_from_tp",
    "layout_ranks",
    "plan",
    "reduce_from_tp",
    "reduce_scatter_to_sp",
    "scatter_to_tp",
    "schedule_order",
    "split_3d",
    "split_sequence",
    "sync_sequence_parallel_grads",
    "tensor_parallel",
    "ZeroDataParallel",
    "paper_memory_bytes",
]
