"""nccl-tests style bandwidth sweeps for ringcomm, side by side with torch gloo / nccl and MPI.

Run it as ``ringcomm-bench`` (or ``python benchmarks/sweep.py``); ``ringcomm-bench -h``
lists the flags, which follow nccl-tests (-b -e -f -i -n -w -o -d -r -c).

Modules, from the bottom up:

- ``sizes``        size parsing (K/M/G suffixes) and the size list, as nccl-tests builds it
- ``collectives``  per-primitive buffer layouts and busbw factors
- ``check``        rank-dependent input values, numpy expected results, #wrong counting
- ``buffers``      data types and page-aligned buffers shared by every backend
- ``backends``     ringcomm, torch gloo / nccl and MPI behind one small interface
- ``timing``       the measurement loop (barrier, time, max over ranks, median)
- ``launch``       rank discovery (spawned / torchrun / mpirun) and the rendezvous store
- ``report``       the nccl-tests table, the JSON file and the machine facts
- ``plot``         busbw and latency against size (matplotlib, Agg)
- ``cli``          argument parsing and the sweep itself
- ``simulate``     --simulate: the cost model over a described topology (no ranks), presets
- ``simulate_plot`` its plot: predicted busbw against size, latency against ranks

Nothing here imports torch, mpi4py or the native core at import time, so the pure
parts (sizes, factors, checks) are usable and testable on their own.
"""

from ringcomm.bench.collectives import COLLECTIVES, busbw_factor
from ringcomm.bench.sizes import parse_size, size_list

__all__ = ["COLLECTIVES", "busbw_factor", "parse_size", "size_list"]
