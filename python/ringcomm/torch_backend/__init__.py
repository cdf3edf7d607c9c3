"""The "ringcomm" torch.distributed backend.

    import ringcomm.torch_backend            # registers "ringcomm" with torch.distributed
    torch.distributed.init_process_group("ringcomm")        # under torchrun

The import is optional: torch registers the name itself at `import torch`
through the "torch.backends" entry point (_ringcomm_autoload), and imports
this module when it first creates a ringcomm group.

Then DDP, FSDP2, new_group, DeviceMesh, functional collectives and
torch.distributed.pipelining run on ringcomm for CPU tensors. The backend
is a torch.distributed.ProcessGroup written in Python over the native
communicator, so one ringcomm build serves every torch version that has
Python process groups (no libtorch linking). torch uses such a process
group for the whole group, so "cpu:ringcomm,cuda:nccl" is not possible:
ringcomm is the only backend of the groups it serves.
"""
import torch.distributed as dist

from ringcomm.torch_backend.process_group import BACKEND_NAME, ProcessGroupRingcomm

__all__ = ["BACKEND_NAME", "ProcessGroupRingcomm", "register"]


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
    """Registers "ringcomm" with torch.distributed for CPU tensors (idempotent)."""
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=["cpu"])


register()
