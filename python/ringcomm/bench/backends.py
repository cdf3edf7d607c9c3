"""The libraries the sweep compares, behind one small interface.

A backend turns (primitive, buffers, redop, root) into a zero-argument callable that
runs one call (``bind``), so the timed loop pays no dispatch or argument building.
Backends are created in the same order on every rank (they rendezvous through the
store), and they all run over the same page-aligned buffers.

- ringcomm: ``ringcomm.init`` on a prefixed view of the job's store; the transport
  and algorithm are chosen with RINGCOMM_TRANSPORT / RINGCOMM_ALGO, which the CLI
  sets before ``init`` reads them.
- gloo / nccl: torch.distributed process groups made with ``new_group``, separate
  from the control group the harness itself uses (its own connections and keys).
- mpi: mpi4py's COMM_WORLD (duplicated); only when the ranks were started by mpirun
  (or mpiexec: Open MPI, MPICH and Intel MPI alike, whichever libmpi mpi4py loads).
- deepspeed: DeepSpeed's CPU shared-memory all_reduce, deepspeed.comm.inference_all_reduce
  on its CPU accelerator, as DeepSpeed's CPU inference calls it; all_reduce SUM only.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Optional

from ringcomm.bench.buffers import Buffers, DType
from ringcomm.bench.collectives import Collective

Runner = Callable[[], None]


class BackendUnavailable(Exception):
    """The backend cannot run in this job (not installed, not under mpirun, no GPU...)."""


class Backend:
    name = "?"
    device = "cpu"
    notes: Dict[str, str] = {}

    def unsupported(self, coll: Collective, dtype: DType, redop: str) -> Optional[str]:
        """Why this (primitive, dtype, redop) cannot run here, or None if it can."""
        return None

    def bind(self, coll: Collective, bufs: Buffers, redop: str, root: int) -> Runner:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for device work (GPU backends); CPU calls complete before returning."""

    def describe(self) -> Dict[str, str]:
        return {}

    def exploring(self) -> bool:
        """Whether the backend is still trying candidates for the call it just ran
        (the warm-up goes on until it is not: the samples are its steady state).
        Every rank must answer alike after the same calls."""
        return False

    def close(self) -> None:
        pass


def _prefix_store(store, prefix: str):
    import torch.distributed as dist

    return dist.PrefixStore(prefix, store)


# --------------------------------------------------------------------------- ringcomm

class RingcommBackend(Backend):
    name = "ringcomm"

    def __init__(self, rank: int, world_size: int, store, timeout_s: float,
                 transport: Optional[str], algo: Optional[str], buffers: str = "numpy",
                 device: str = "cpu", local_rank: int = 0, name: str = "ringcomm"):
        self.name = name  # ringcomm[ALGO] when one run compares several algorithms
        try:
            import ringcomm
        except ImportError as e:
            raise BackendUnavailable(f"ringcomm does not import ({e})") from e
        if not hasattr(ringcomm, "init"):
            raise BackendUnavailable("ringcomm has no init() (the core is not built yet)")
        built = tuple(ringcomm.build_info().get("transports", ())) \
            if hasattr(ringcomm, "build_info") else ()
        if transport and built and transport not in built:
            raise BackendUnavailable(f"this ringcomm build has no {transport!r} transport "
                                     f"(it has: {', '.join(built)})")
        # init() reads these; set them only when asked, so the library's own
        # defaults (and a user's environment) hold otherwise.
        if transport:
            os.environ["RINGCOMM_TRANSPORT"] = transport
        if algo:
            os.environ["RINGCOMM_ALGO"] = algo
        self.rc = ringcomm
        self.rank, self.world_size = rank, world_size
        self.comm = ringcomm.init(rank=rank, world_size=world_size,
                                  store=_prefix_store(store, "ringcomm/"), timeout=timeout_s)
        self.transport = os.environ.get("RINGCOMM_TRANSPORT") or (
            "auto of " + "/".join(built) if built else "auto")
        self.algo = os.environ.get("RINGCOMM_ALGO", "auto")
        self.buffers = buffers
        self.notes = {}
        self.torch = None
        if device == "cuda":
            import torch

            if not ringcomm.cuda.available():
                raise BackendUnavailable("ringcomm's GPU path needs a CUDA build and a GPU "
                                         f"(build_info: cuda={ringcomm.build_info().get('cuda')})")
            self.torch = torch
            self.device = f"cuda:{local_rank % torch.cuda.device_count()}"
            torch.cuda.set_device(self.device)
            self.algo = "gpu " + (os.environ.get("RINGCOMM_GPU_ALGO") or "auto")

    def exploring(self) -> bool:
        # The tuner (auto) tries the other candidates of a size after its first
        # calls; its state changes in the same call on every rank.
        if not hasattr(self.comm, "tuning"):
            return False
        return any(t.get("state") == "exploring" for t in self.comm.tuning())

    def describe(self) -> Dict[str, str]:
        return {"version": str(getattr(self.rc, "__version__", "?")),
                "transport": self.transport, "algo": self.algo,
                "buffers": "numpy arrays" if self.buffers == "numpy" else "torch tensors",
                "cost_model": str(self.comm.cost_params().get("source", "?"))}

    def _view(self, buf):
        # Same memory either way; numpy where asked and numpy has the type.
        if buf is None:
            return None
        if self.device != "cpu":
            return buf.tensor
        if self.buffers == "numpy" and buf.array is not None:
            return buf.array
        return buf.tensor

    def unsupported(self, coll, dtype, redop):
        if coll.name == "sendrecv" and self.world_size < 2:
            return "sendrecv needs 2 ranks"
        return None

    def bind(self, coll, bufs, redop, root):
        # The communicator's methods with the op resolved once, as the MPI
        # backend calls its communicator with MPI.SUM.
        comm = self.comm
        out = self._view(bufs.output)
        inp = self._view(bufs.input)
        name = coll.name
        op = self.rc.ReduceOp[redop.upper()] if coll.reduces else None
        if name == "all_reduce":
            return lambda: comm.all_reduce(out, op)
        if name == "reduce_scatter":
            return lambda: comm.reduce_scatter(out, inp, op)
        if name == "all_gather":
            return lambda: comm.all_gather(out, inp)
        if name == "broadcast":
            return lambda: comm.broadcast(out, root)
        if name == "reduce":
            return lambda: comm.reduce(out, root, op)
        if name == "scatter":
            return lambda: comm.scatter(out, inp, root)
        if name == "gather":
            return lambda: comm.gather(out, inp, root)
        if name == "all_to_all":
            return lambda: comm.all_to_all(out, inp)
        if name == "sendrecv":
            nxt, prv = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size

            return lambda: comm.sendrecv(inp, nxt, out, prv)
        raise ValueError(f"ringcomm backend: unknown primitive {name!r}")

    def barrier(self):
        self.synchronize()
        self.rc.barrier(comm=self.comm)

    def synchronize(self):
        if self.torch is not None:
            self.torch.cuda.synchronize(self.device)

    def close(self):
        self.comm.close()


def same_host_groups(transports: List[List[str]]) -> List[List[int]]:
    """The ranks ringcomm put on one host, from every rank's `Communicator.transports`
    (rank r's row: how r reaches each rank): r's group is itself and the peers it
    reaches over shared memory. Groups in order of their lowest rank; a pair of ranks
    that disagree shows up as groups that overlap."""
    groups = []
    for r, row in enumerate(transports):
        group = sorted({r} | {q for q, how in enumerate(row) if how == "shm"})
        if group not in groups:
            groups.append(group)
    return sorted(groups)


def format_host_groups(groups: List[List[int]]) -> str:
    """[[0, 2], [1, 3]] -> "0,2 | 1,3"."""
    return " | ".join(",".join(map(str, g)) for g in groups)


# --------------------------------------------------------------------------- torch

class TorchBackend(Backend):
    """torch.distributed gloo (CPU tensors) or nccl (CUDA tensors)."""

    def __init__(self, name: str, rank: int, world_size: int, local_rank: int,
                 timeout_s: float):
        import datetime

        import torch
        import torch.distributed as dist

        self.name = name
        self.dist, self.torch = dist, torch
        self.rank, self.world_size = rank, world_size
        if name == "nccl":
            if not torch.cuda.is_available():
                raise BackendUnavailable("nccl needs CUDA GPUs; torch sees none")
            if not dist.is_nccl_available():
                raise BackendUnavailable("this torch build has no nccl")
            ndev = torch.cuda.device_count()
            self.device = f"cuda:{local_rank % ndev}"
            torch.cuda.set_device(self.device)
        self.group = dist.new_group(backend=name,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        R = dist.ReduceOp
        self.ops = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG}
        # torch 2.13 renamed the tensor-in/tensor-out collectives (*_single) and warns
        # on the old names; older torch only has the old ones.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                                or dist.reduce_scatter_tensor)

    def describe(self):
        info = {"version": self.torch.__version__}
        if self.name == "nccl":
            info["nccl"] = ".".join(map(str, self.torch.cuda.nccl.version()))
            info["device"] = self.torch.cuda.get_device_name(self.device)
        return info

    def unsupported(self, coll, dtype, redop):
        if coll.name == "sendrecv" and self.world_size < 2:
            return "sendrecv needs 2 ranks"
        if self.name == "gloo" and redop == "avg" and coll.reduces and not dtype.floating:
            return "avg on integers"
        return None

    def bind(self, coll, bufs, redop, root):
        dist, g = self.dist, self.group
        out = bufs.output.tensor
        inp = bufs.input.tensor if bufs.input is not None else None
        op = self.ops[redop]
        n, rank = self.world_size, self.rank
        name = coll.name
        if name == "all_reduce":
            return lambda: dist.all_reduce(out, op=op, group=g)
        if name == "reduce_scatter":
            fn = self._reduce_scatter
            return lambda: fn(out, inp, op=op, group=g)
        if name == "all_gather":
            fn = self._all_gather
            return lambda: fn(out, inp, group=g)
        if name == "broadcast":
            return lambda: dist.broadcast(out, src=root, group=g)
        if name == "reduce":
            return lambda: dist.reduce(out, dst=root, op=op, group=g)
        if name == "scatter":
            chunks = list(inp.chunk(n)) if rank == root else None
            return lambda: dist.scatter(out, chunks, src=root, group=g)
        if name == "gather":
            chunks = list(out.chunk(n)) if rank == root else None
            return lambda: dist.gather(inp, chunks, dst=root, group=g)
        if name == "all_to_all":
            return lambda: dist.all_to_all_single(out, inp, group=g)
        if name == "sendrecv":
            nxt, prv = (rank + 1) % n, (rank - 1) % n

            def sendrecv():
                for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, inp, nxt, g),
                                                 dist.P2POp(dist.irecv, out, prv, g)]):
                    w.wait()
            return sendrecv
        raise ValueError(f"{self.name} backend: unknown primitive {name!r}")

    def barrier(self):
        if self.name == "nccl":
            self.dist.barrier(group=self.group, device_ids=[self.torch.device(self.device).index])
        else:
            self.dist.barrier(group=self.group)
        self.synchronize()

    def synchronize(self):
        if self.name == "nccl":
            self.torch.cuda.synchronize(self.device)

    def close(self):
        self.dist.destroy_process_group(self.group)


# --------------------------------------------------------------------------- MPI

# MPI reductions need a numpy type MPI knows; data movement goes as bytes (any type).
_MPI_REDUCE_TYPES = {"float32", "float64", "int8", "uint8", "int32", "int64"}


class MpiBackend(Backend):
    name = "mpi"

    def __init__(self):
        from ringcomm.bench import launch

        if not launch.under_mpirun():
            raise BackendUnavailable("the ranks were not started by mpirun; run e.g. "
                                     "mpirun -np 2 ringcomm-bench --backends mpi,...")
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise BackendUnavailable(f"mpi4py is not installed ({e})") from e
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD.Dup()
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                    "avg": MPI.SUM}
        self.notes = {"avg": "MPI has no AVG: SUM, then a local numpy division (timed)"}

    def describe(self):
        import mpi4py

        # Open MPI's string ends in a NUL and carries build details after a comma.
        text = self.MPI.Get_library_version().replace("\0", "").strip()
        first = text.splitlines()[0] if text else "unknown"
        return {"version": mpi4py.__version__, "library": first.split(",")[0].strip()}

    def unsupported(self, coll, dtype, redop):
        if coll.reduces and dtype.name not in _MPI_REDUCE_TYPES:
            return f"MPI has no {dtype.name} reductions"
        if coll.reduces and redop == "avg" and not dtype.floating:
            return "avg on integers"
        return None

    def bind(self, coll, bufs, redop, root):
        rank, n = self.rank, self.world_size
        if coll.reduces:
            out = bufs.output.array
            inp = bufs.input.array if bufs.input is not None else None
        else:
            out = bufs.output.bytes
            inp = bufs.input.bytes if bufs.input is not None else None
        run = self._bind(coll.name, inp, out, self.ops[redop], root)
        if redop == "avg" and coll.reduces and (coll.name != "reduce" or rank == root):
            import numpy as np

            total = run

            def averaged():
                total()
                np.divide(out, n, out=out)
            return averaged
        return run

    def _bind(self, name, inp, out, op, root) -> Runner:
        MPI, comm = self.MPI, self.comm
        rank, n = self.rank, self.world_size
        if name == "all_reduce":
            return lambda: comm.Allreduce(MPI.IN_PLACE, out, op)
        if name == "reduce_scatter":
            return lambda: comm.Reduce_scatter_block(inp, out, op)
        if name == "all_gather":
            return lambda: comm.Allgather(inp, out)
        if name == "broadcast":
            return lambda: comm.Bcast(out, root)
        if name == "reduce":
            if rank == root:
                return lambda: comm.Reduce(MPI.IN_PLACE, out, op, root)
            return lambda: comm.Reduce(out, None, op, root)
        if name == "scatter":
            send = inp if rank == root else None
            return lambda: comm.Scatter(send, out, root)
        if name == "gather":
            recv = out if rank == root else None
            return lambda: comm.Gather(inp, recv, root)
        if name == "all_to_all":
            return lambda: comm.Alltoall(inp, out)
        if name == "sendrecv":
            nxt, prv = (rank + 1) % n, (rank - 1) % n
            return lambda: comm.Sendrecv(inp, nxt, recvbuf=out, source=prv)
        raise ValueError(f"mpi backend: unknown primitive {name!r}")

    def barrier(self):
        self.comm.Barrier()

    def close(self):
        self.comm.Free()


# --------------------------------------------------------------------------- DeepSpeed

# The dtypes its shared-memory kernels reduce, with the ISA level each needs
# (DeepSpeed's vector_kernel_level(): 1 AVX2, 2 AVX-512BW).
_DS_SHM_LEVEL = {"float32": 1, "bfloat16": 2, "float16": 2}


def stale_build_lock(name: str, max_age_s: float = 600.0) -> Optional[str]:
    """The lock file of torch's JIT build directory for extension `name`, when
    it is older than `max_age_s` (a build takes about a minute here): a build
    killed midway leaves it, and every later build of the extension waits on
    it for ever. None when there is none, or it is fresh."""
    try:
        # torch's own rule for the directory (TORCH_EXTENSIONS_DIR, else its default root).
        from torch.utils.cpp_extension import _get_build_directory

        lock = os.path.join(_get_build_directory(name, False), "lock")
    except Exception:  # noqa: BLE001 (a private helper of torch's: any failure, no check)
        return None
    try:
        age = time.time() - os.stat(lock).st_mtime
    except OSError:
        return None
    return lock if age > max_age_s else None


class DeepSpeedBackend(Backend):
    """deepspeed.comm.inference_all_reduce on the CPU accelerator: DeepSpeed's
    shared-memory all_reduce (its deepspeed_shm_comm op, built by DeepSpeed on
    first use), over the harness's default (gloo) process group, which
    deepspeed.init_distributed takes over as it does any initialised group.
    DeepSpeed uses the op only when every rank is on this host (LOCAL_SIZE) and
    the CPU has the ISA its kernel for the dtype needs; otherwise its call
    falls back to torch.distributed.all_reduce (gloo), which this backend
    refuses to time under DeepSpeed's name."""

    name = "deepspeed"

    def __init__(self, world_size: int, local_size: int):
        if local_size != world_size:
            raise BackendUnavailable(f"DeepSpeed's shared-memory all_reduce needs every rank on one "
                                     f"host ({local_size} of {world_size} are on this one)")
        # DeepSpeed picks its accelerator at import; its shm op reads LOCAL_SIZE.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ["LOCAL_SIZE"] = str(local_size)
        try:
            import deepspeed
            import deepspeed.comm as dcomm
        except ImportError as e:
            raise BackendUnavailable(f"deepspeed is not installed ({e})") from e
        from deepspeed.accelerator import get_accelerator

        if get_accelerator().device_name() != "cpu":
            raise BackendUnavailable(f"DeepSpeed's accelerator is {get_accelerator().device_name()!r}, "
                                     "not cpu (set DS_ACCELERATOR=cpu)")
        stale = stale_build_lock("deepspeed_shm_comm")
        if stale:
            raise BackendUnavailable(f"DeepSpeed's op build lock {stale} is older than any build (a build killed "
                                     "midway leaves it, and torch then waits on it forever): remove it")
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        cdb = dcomm.comm.cdb
        if getattr(cdb, "shm_comm_op", None) is None:
            raise BackendUnavailable("DeepSpeed's shared-memory op (deepspeed_shm_comm) did not build "
                                     "or load; see its build output above")
        self.deepspeed, self.dcomm = deepspeed, dcomm
        self.level = int(getattr(cdb, "shm_vector_kernel_level", 0))

    def describe(self):
        return {"version": self.deepspeed.__version__,
                "op": f"deepspeed_shm_comm, kernel ISA level {self.level}"}

    def unsupported(self, coll, dtype, redop):
        if coll.name != "all_reduce":
            return "DeepSpeed's shared-memory op is an all_reduce"
        if redop != "sum":
            return "DeepSpeed's shared-memory all_reduce sums"
        need = _DS_SHM_LEVEL.get(dtype.name)
        if need is None:
            return f"DeepSpeed's shared-memory all_reduce has no {dtype.name} kernel"
        if self.level < need:
            return (f"this CPU lacks the ISA of DeepSpeed's {dtype.name} kernel (level {self.level} < {need}): "
                    "DeepSpeed would fall back to gloo")
        return None

    def bind(self, coll, bufs, redop, root):
        t = bufs.output.tensor
        fn = self.dcomm.inference_all_reduce
        return lambda: fn(t)

    def barrier(self):
        import torch.distributed as dist

        dist.barrier()


BACKEND_NAMES = ("ringcomm", "gloo", "nccl", "mpi", "deepspeed")
