"""ringcomm standing in for torch's gloo backend, for test suites gated on "gloo".

Much of torch's own distributed test suite (and of other projects' suites)
runs only when the backend is named "gloo". `install_as_gloo()` makes every
process group torch creates for the "gloo" name a ProcessGroupRingcomm, so
that those tests run unchanged against ringcomm. It must run in every rank
before the first group is created; it changes nothing else (torch's
ProcessGroupGloo class stays reachable as `torch.distributed.ProcessGroupGloo`
for code that builds one explicitly).

This is a testing aid. Applications should ask for "ringcomm" by name.
"""
import types

import torch.distributed.distributed_c10d as c10d

from ringcomm.torch_backend.process_group import ProcessGroupRingcomm

_REAL_GLOO = c10d.ProcessGroupGloo


class GlooStandIn(ProcessGroupRingcomm):
    """Built where torch would build ProcessGroupGloo(store, rank, size, timeout=...)."""

    def __init__(self, store, rank, size, timeout=None):
        super().__init__(store, rank, size, timeout)
        # torch's gloo path sets these on the backend's options after building it.
        self.options = types.SimpleNamespace(global_ranks_in_group=None, group_name=None, _timeout=timeout)
        self._profiling_name = "gloo"  # the name torch knows the group by, as its profiler events say

    # pg.name() stays "ringcomm": reporting "gloo" there makes DDP's C++ logger
    # look up a gloo backend under the group ("Could not find backend type 1"),
    # so torch's test_ddp_logging_data_cpu, which expects "gloo", cannot pass here.


def install_as_gloo():
    """Routes torch's "gloo" backend to ringcomm in this process (idempotent)."""
    c10d.ProcessGroupGloo = GlooStandIn


def uninstall():
    """Restores torch's gloo."""
    c10d.ProcessGroupGloo = _REAL_GLOO
