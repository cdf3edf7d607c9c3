"""torch's plugin hook for ringcomm: makes init_process_group("ringcomm") work
without an import of ringcomm.

torch runs every entry point of the "torch.backends" group inside `import torch`
(torch/__init__.py, _import_device_backends; TORCH_DEVICE_BACKEND_AUTOLOAD=0
turns that off) and turns any exception there into a failed `import torch`.
So this module lives outside the ringcomm package (importing any module of
it would run ringcomm/__init__.py, which loads the native module) and imports
nothing but what torch has already imported: the hook only registers the name
"ringcomm", and the backend itself is imported when torch first creates a
ringcomm process group. It never raises.
"""

BACKEND_NAME = "ringcomm"


def _create_process_group(dist_backend_opts, backend_options):
    """torch's creator (extended API), imported on first use."""
    from ringcomm.torch_backend import _create_process_group as create

    return create(dist_backend_opts, backend_options)


def _autoload():
    """The entry point: registers "ringcomm" with torch.distributed for CPU and CUDA tensors."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or BACKEND_NAME in dist.Backend.backend_list:
            return  # a torch without distributed, or ringcomm.torch_backend already registered it
        dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=["cpu", "cuda"])
    except Exception:  # noqa: BLE001 - an exception here would make `import torch` fail
        import logging

        logging.getLogger(__name__).debug("ringcomm: not registered with torch.distributed", exc_info=True)
