"""The cuda_ipc transport's setup and selection, shared by the GPU path (ringcomm/cuda.py) and the
CPU stand-in the tests drive (tests/ipc_standin.py): the settings every rank must
agree on, and the exchange of buffer handles through the store.

The protocol itself (buffer layout, flags, sequence numbers, bounded waits, errors) is
csrc/transport/cuda_ipc/ipc_channel.h.

Settings (rank 0's hold for every rank): RINGCOMM_IPC_SLOT_BYTES, RINGCOMM_IPC_NSLOTS,
RINGCOMM_IPC_STAGE_BYTES, RINGCOMM_IPC_ONESHOT_MAX_BYTES and RINGCOMM_IPC_TWOSHOT_MAX_BYTES
(_ENV below), their defaults DEFAULTS; what each means is in config.py's GPU_SETTINGS, from
which docs/configuration.md is generated.
The thresholds are to be set from the latencies scripts/gpu_check.sh measures
(scripts/ipc_bench.py); the defaults are not measured.
"""
import json
import os

from ringcomm import _C, bootstrap, validate
from ringcomm.errors import RingcommError

DEFAULTS = {
    "slot_bytes": 1 << 20,
    "nslots": 4,
    "stage_bytes": 8 << 20,
    "one_shot_max": 256 << 10,
    "two_shot_max": 4 << 20,
}
_ENV = {
    "slot_bytes": "RINGCOMM_IPC_SLOT_BYTES",
    "nslots": "RINGCOMM_IPC_NSLOTS",
    "stage_bytes": "RINGCOMM_IPC_STAGE_BYTES",
    "one_shot_max": "RINGCOMM_IPC_ONESHOT_MAX_BYTES",
    "two_shot_max": "RINGCOMM_IPC_TWOSHOT_MAX_BYTES",
}
_HANDLE_SCHEMA = {"handle": validate.text(1024)}


def pick_gpu_transport(configured, infos):
    """The transport of a communicator's GPU calls on one device, from every rank's
    {"host", "gpu"} (gpu: the PCI bus id of the rank's device) and the configured
    transport (RINGCOMM_TRANSPORT / init(transport=)):

    - "cuda_ipc": cuda_ipc, which reaches the ranks of one host only;
    - otherwise: NCCL, unless two ranks share a GPU (NCCL refuses them: "Duplicate
      GPU detected"), which cuda_ipc serves when every rank is on one host.

    Raises RingcommError when no transport can serve the ranks."""
    hosts = {i["host"] for i in infos}
    seen, shared = {}, []
    for r, i in enumerate(infos):
        key = (i["host"], i["gpu"])
        if key in seen:
            shared.append((seen[key], r))
        else:
            seen[key] = r
    if configured == "cuda_ipc":
        if len(hosts) > 1:
            raise RingcommError("ringcomm: transport cuda_ipc reaches the ranks of one host, but this communicator "
                                f"spans {len(hosts)} hosts; use the default transport (NCCL) across hosts")
        return "cuda_ipc"
    if not shared:
        return "nccl"
    if len(hosts) > 1:
        a, b = shared[0]
        raise RingcommError(f"ringcomm: ranks {a} and {b} share one GPU, which NCCL refuses, and cuda_ipc (which "
                            f"serves ranks sharing a GPU) reaches one host only, but this communicator spans "
                            f"{len(hosts)} hosts: give every rank its own GPU")
    return "cuda_ipc"


def settings(overrides=None):
    """This rank's settings: DEFAULTS, then the environment, then `overrides`.
    Raises ValueError naming a bad variable."""
    s = dict(DEFAULTS)
    for key, var in _ENV.items():
        raw = os.environ.get(var)
        if raw:
            try:
                s[key] = int(raw.strip(), 10)
            except ValueError:
                raise ValueError(f"environment variable {var}={raw!r} is not an integer") from None
    s.update(overrides or {})
    for key in ("slot_bytes", "stage_bytes"):
        if not 64 <= s[key] <= (1 << 30) or s[key] % 64:
            raise ValueError(f"{_ENV[key]} must be a multiple of 64 between 64 and 1 GiB, got {s[key]}")
    if not 1 <= s["nslots"] <= 64:
        raise ValueError(f"{_ENV['nslots']} must be between 1 and 64, got {s['nslots']}")
    for key in ("one_shot_max", "two_shot_max"):
        if s[key] < 0:
            raise ValueError(f"{_ENV[key]} must not be negative, got {s[key]}")
    return s


def _known_algo(name):
    """Whether rank 0's RINGCOMM_IPC_ALGO (read from the store) is one cuda_ipc runs (csrc/comm/chooser.h)."""
    try:
        _C.parse_algo("cuda_ipc", name, "RINGCOMM_IPC_ALGO")
    except (TypeError, ValueError):
        return False
    return True


def agree(store, key, rank, timeout_s, mine):
    """Rank 0's settings, for every rank (ranks with other geometries could not read
    each other's buffers)."""
    if rank == 0:
        store.set(key, json.dumps(mine))
    bootstrap.wait_keys(store, [key], timeout_s, "waiting for rank 0's cuda_ipc settings", rank)
    shared = json.loads(bootstrap._text(store.get(key)))
    if (not isinstance(shared, dict) or not all(isinstance(shared.get(k), int) for k in DEFAULTS)
            or not _known_algo(shared.get("algo", "auto"))):
        raise RingcommError(f"ringcomm: rank 0's cuda_ipc settings under {key!r} are not what this rank "
                            f"expects (got {sorted(shared)}); do all ranks run the same ringcomm version?")
    return shared


def connect(native, store, prefix, rank, world_size, timeout_s):
    """Publishes `native`'s buffer handle, maps every peer's, and once every rank has
    mapped every buffer lets the handles go (the host stand-in's names leave
    /dev/shm then: a crash after this leaves nothing behind)."""
    got = bootstrap.exchange(store, f"{prefix}/handles", rank, world_size, {"handle": native.handle()},
                             timeout_s, schema=_HANDLE_SCHEMA)
    native.connect([rec["handle"] for rec in got])
    bootstrap.barrier(store, prefix, "mapped", rank, world_size, timeout_s)
    native.exported()
