"""Who am I, how many are we, and where is the store: spawned, torchrun or mpirun.

Three ways to start a sweep, one code path after this module:

- ``ringcomm-bench --nproc N`` (the default, N=2): the command re-runs itself as N
  local processes with torchrun's variables set, and supervises them;
- ``torchrun --nproc-per-node N [--nnodes M ...] -m ringcomm.bench.cli ...``:
  RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT come from torchrun;
- ``mpirun -np N ringcomm-bench ...``: rank and size come from MPI, and rank 0
  publishes the store's address (its host, a free port) with an MPI broadcast.

Every backend then rendezvouses through one ``torch.distributed.TCPStore``, each
under its own key prefix. (torchrun offers one port only, so prefixes, not ports,
keep ringcomm's, gloo's and the harness's keys apart.)
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

SPAWNED_ENV = "RINGCOMM_BENCH_SPAWNED"
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


@dataclass
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    launcher: str            # "spawn", "torchrun", "env", "mpirun", "single"
    master_addr: str
    master_port: int
    store_is_client: bool    # torchrun's agent hosts the store: every rank is a client
    notices: List[str]


def under_mpirun() -> bool:
    return any(v in os.environ for v in _MPI_RANK_VARS)


def launched_externally() -> bool:
    """True when a launcher (ours, torchrun, mpirun) already made this process a rank."""
    return under_mpirun() or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _env_int(names, default: Optional[int] = None) -> Optional[int]:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


def detect() -> RankInfo:
    """This process's place in the job (call after deciding not to spawn)."""
    notices: List[str] = []
    if under_mpirun():
        return _detect_mpi(notices)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        launcher = ("spawn" if os.environ.get(SPAWNED_ENV) else
                    "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "env")
        return RankInfo(
            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
            launcher=launcher,
            master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(os.environ.get("MASTER_PORT", "29500")),
            store_is_client=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            notices=notices)
    return RankInfo(0, 1, 0, "single", "127.0.0.1", free_port(), False, notices)


def _detect_mpi(notices: List[str]) -> RankInfo:
    try:
        from mpi4py import MPI
    except ImportError:
        MPI = None
    if MPI is None:
        rank = _env_int(_MPI_RANK_VARS)
        size = _env_int(_MPI_SIZE_VARS)
        if size is None:
            raise RuntimeError("started by an MPI launcher, but neither mpi4py nor a "
                               "world-size variable (OMPI_COMM_WORLD_SIZE, PMI_SIZE) is there")
        notices.append("mpi4py is not installed: the mpi backend is skipped, and the store "
                       "is at MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29500)")
        return RankInfo(rank, size, _env_int(("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
                                             rank),
                        "mpirun", os.environ.get("MASTER_ADDR", "127.0.0.1"),
                        int(os.environ.get("MASTER_PORT", "29500")), False, notices)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = local.Get_rank()
    local.Free()
    hosts = world.allgather(socket.gethostname())
    addr_port = None
    if rank == 0:
        if "MASTER_ADDR" in os.environ:
            addr = os.environ["MASTER_ADDR"]
        else:
            addr = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostname()
        port = int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else free_port(
            "0.0.0.0")
        addr_port = (addr, port)
    addr, port = world.bcast(addr_port, root=0)
    return RankInfo(rank, size, local_rank, "mpirun", addr, port, False, notices)


def make_store(info: RankInfo, timeout_s: float):
    """The job's TCPStore (rank 0 hosts it, unless torchrun's agent already does)."""
    import torch.distributed as dist

    is_master = info.rank == 0 and not info.store_is_client
    return dist.TCPStore(info.master_addr, info.master_port, info.world_size, is_master,
                         timeout=datetime.timedelta(seconds=timeout_s))


def die_with_parent() -> None:
    """A spawned rank must not outlive its launcher (Linux; best effort)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def spawn(nproc: int, argv: List[str]) -> int:
    """Run this command as ``nproc`` local ranks; return the worst exit status.

    The ranks inherit stdout and stderr (only rank 0 prints the table). If one rank
    fails, the others are stopped instead of waiting for their timeouts.
    """
    import ringcomm.bench

    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(ringcomm.bench.__file__)))
    port = free_port()
    procs: List[subprocess.Popen] = []
    for rank in range(nproc):
        env = dict(os.environ)
        env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), **{SPAWNED_ENV: "1"})
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (pkg_root, os.environ.get("PYTHONPATH")) if p)
        procs.append(subprocess.Popen([sys.executable, "-m", "ringcomm.bench.cli", *argv],
                                      env=env))
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or all(c is not None for c in codes):
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        failed = [130]
    if failed:
        _stop(procs)
        bad = [f"rank {r} exited with {p.returncode}" for r, p in enumerate(procs)
               if p.returncode not in (0, None, -signal.SIGTERM, -signal.SIGKILL)]
        if bad:
            print(f"ringcomm-bench: {'; '.join(bad)}", file=sys.stderr)
        return failed[0] if failed[0] > 0 else 1
    return 0


def _stop(procs: List[subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
