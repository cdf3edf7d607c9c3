"""The "ringcomm" torch.distributed backend.

    import ringcomm.torch_backend            # registers "ringcomm" with torch.distributed
    torch.distributed.init_process_group("ringcomm")        # under torchrun

The import is optional: torch registers the name itself at `import torch`
through the "torch.backends" entry point (_ringcomm_autoload), and imports
this module when it first creates a ringcomm group.

Then DDP, FSDP2, new_group, DeviceMesh, functional collectives and
torch.distributed.pipelining run on ringcomm, for CPU tensors and for CUDA
tensors (ringcomm's GPU path, with the stream semantics of torch's NCCL
backend). The backend is a torch.distributed.ProcessGroup written in Python
over the native communicator, so one ringcomm build serves every torch
version that has Python process groups (no libtorch linking). torch uses such
a process group for the whole group, so "cpu:ringcomm,cuda:nccl" is not
possible: ringcomm is the only backend of the groups it serves, and answers
the per-device lookups torch makes itself (docs/torch_backend.md).
"""
import torch.distributed as dist

from ringcomm.torch_backend.process_group import BACKEND_NAME, ProcessGroupRingcomm

__all__ = ["BACKEND_NAME", "ProcessGroupRingcomm", "monitored_barrier", "register"]


def _create_process_group(dist_backend_opts, backend_options):
    """torch's creator (extended API): one ProcessGroupRingcomm per group."""
    if backend_options is not None:
        raise ValueError(
            f"ringcomm: the backend takes no pg_options (got {type(backend_options).__name__}); "
            "tune it with the RINGCOMM_* environment variables"
        )
    return ProcessGroupRingcomm(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
        group_name=str(dist_backend_opts.group_id),
    )


def register():
    """Registers "ringcomm" with torch.distributed for CPU and CUDA tensors (idempotent)."""
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=["cpu", "cuda"])


register()


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """gloo's monitored barrier on a ringcomm group (see ProcessGroupRingcomm.monitored_barrier).

    torch's own `dist.monitored_barrier` refuses any backend not named
    "gloo" before it reaches the group, so ringcomm groups take it here:
    rank 0 raises naming the first rank (every rank, with wait_all_ranks)
    that did not arrive within `timeout`; the other ranks raise too.
    """
    from torch.distributed import distributed_c10d as c10d

    pg = group if group is not None else c10d._get_default_group()
    if not isinstance(pg, ProcessGroupRingcomm):
        raise ValueError(f"ringcomm.torch_backend.monitored_barrier: {pg!r} is not a ringcomm group; "
                         "use torch.distributed.monitored_barrier for gloo groups")
    return pg.monitored_barrier(timeout, wait_all_ranks)
