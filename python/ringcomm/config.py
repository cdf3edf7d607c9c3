"""Communicator settings: keyword arguments of init() first, then environment
variables, then defaults. An empty variable counts as unset; a bad value is a
ValueError naming the variable (a keyword of the wrong type a TypeError).

Every environment variable ringcomm reads is in SETTINGS below, with its
default and meaning: docs/configuration.md's table is generated from it
(`python scripts/gen_config_docs.py`; `--check` only compares).
"""
import os
import re
from typing import Callable, NamedTuple, Union

from ringcomm import _C, validate

DEFAULT_TIMEOUT_S = 300.0
ALGOS = ("auto", "ring", "oneshot", "pull", "recursive_doubling", "rabenseifner", "tree", "bruck",
         "hierarchical", "direct")
RING_ORDERS = ("host", "rank")
SLOT_STORES = ("auto", "cached", "streamed")
TRANSPORTS = ("auto", "shm", "tcp", "cuda_ipc")

# Ranges of the size settings. The one-shot all_reduce keeps a scratch buffer
# of world_size * RINGCOMM_ONESHOT_MAX_BYTES, allocated at init: 1 GiB (the
# largest slot too) is already far past where one-shot pays. A pull threshold
# must fit the native size_t; the largest int64 means "never pull".
MAX_SLOT_BYTES = 1 << 30
MAX_ONESHOT_BYTES = 1 << 30
MAX_PULL_MIN_BYTES = (1 << 63) - 1
MIN_SLOTS, MAX_SLOTS = 3, 4096
# Plans kept (csrc/comm/plan_cache.h, which also bounds their steps together).
MAX_PLAN_CACHE = 4096
# Spin / yield phases become steady_clock nanoseconds (a duration_cast that
# overflows past ~292 years); a minute is already far past any useful spin.
MAX_WAIT_US = 60e6
# RINGCOMM_HOST_ID is published to every peer (and compared there); interface
# names are at most IFNAMSIZ - 1 = 15 bytes on Linux (longer ones were cut).
MAX_HOST_ID = 255
MAX_IFNAME_BYTES = 15

class Setting(NamedTuple):
    """One environment variable: `default` as the docs show it (a str, or a
    function of the native Config's defaults, so that the docs show what the
    code does), `meaning` (markdown, one line) and the code that reads it."""
    name: str
    default: Union[str, Callable[["_C.Config"], str]]
    meaning: str
    read_by: str = "python/ringcomm/config.py"


def _size(n):
    """Bytes as the docs show them: 65536 (64 KiB), 16 MiB (16777216)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}" if shift >= 20 else f"{n} ({n >> shift} {unit})"
    return str(n)


def _gpu_default(key):
    def show(_cfg):
        from ringcomm import cuda_ipc
        return _size(cuda_ipc.DEFAULTS[key]) if key.endswith(("bytes", "max")) else str(cuda_ipc.DEFAULTS[key])
    return show


def _gpu_chunk(_cfg):
    from ringcomm import cuda
    return _size(cuda.DEFAULT_CHUNK_BYTES)


# The communicator's settings (make_config; RINGCOMM_HOST_ID and
# RINGCOMM_SOCKET_IFNAME are used by bootstrap, checked here).
SETTINGS = (
    Setting("RINGCOMM_TIMEOUT", lambda c: f"{c.timeout_s:g}",
            "seconds a blocking wait may take (more than 0, at most 30 days); also `init(timeout=)`"),
    Setting("RINGCOMM_ALGO", lambda c: c.algo,
            "`auto` (every op picks by size); one name, forced for every op that has it (`pull`: send/recv "
            "too); or per op, `all_reduce:recursive_doubling,broadcast:tree`; the names and the ops that have "
            "each: [algorithms.md](algorithms.md#algorithm-names); also `init(algo=)`"),
    Setting("RINGCOMM_PULL", lambda c: "1" if c.pull else "0",
            "`0` turns single-copy pulls off: large send/recv and the tuner's pull candidates of "
            "collectives from 16 MiB (`0` or `1`)"),
    Setting("RINGCOMM_PULL_MIN_BYTES", lambda c: _size(c.pull_min_bytes),
            "send/recv of at least this size pull (0 to 2**63 - 1)"),
    Setting("RINGCOMM_P2P_UNEXPECTED_MB", lambda c: str(c.p2p_unexpected_bytes >> 20),
            "MiB of messages that arrived before their recv (another tag's, or across a collective) a rank "
            "holds, all peers together; past it a message waits in its FIFO (0 to 2**40)"),
    Setting("RINGCOMM_ONESHOT_MAX_BYTES", lambda c: _size(c.oneshot_max_bytes),
            "the largest all_reduce `auto` may run one-shot (its scratch is world x size, allocated at init; "
            "0 to 1 GiB)"),
    Setting("RINGCOMM_COST_MODEL", lambda c: c.cost_model,
            "what `auto` picks with: `measure` (links measured at init, ~50 ms at most), `default` (built-in "
            "figures), or a file `ringcomm-bench --calibrate FILE` wrote (rank 0 reads it); the same on every rank"),
    Setting("RINGCOMM_RING_ORDER", lambda c: c.ring_order,
            "`host` (each host's ranks next to each other in rings and chains) or `rank` (rank order, for "
            "comparison)"),
    Setting("RINGCOMM_PLAN_CACHE", lambda c: str(c.plan_cache_entries),
            "plans a communicator keeps, one per call signature (op, count, root, algorithm, AVG, element size, "
            "in-place or not), run as they stand on each repeated call's buffers (plans name buffers, not "
            "addresses) so a loop with fresh tensors does not plan its calls again; least recently used dropped "
            "first, all plans together at most 131072 steps (csrc/comm/plan_cache.h); `0` plans every call afresh "
            "(0 to 4096)"),
    Setting("RINGCOMM_SLOT_BYTES", lambda c: _size(c.slot_bytes),
            "bytes per pipelined segment (a multiple of 64, 64 to 1 GiB)"),
    Setting("RINGCOMM_SLOTS", lambda c: str(c.nslots), "segments in flight per peer (3 to 4096)"),
    Setting("RINGCOMM_SLOT_STORES", lambda c: c.slot_stores,
            "how a rank writes the shared-memory slots it sends in: `auto` (each link measures both ways, "
            "its fills and its peer's copies out, and writes the cheaper: on some placements of a VM's cores, "
            "lines move 3-5x slower between the cores' caches than through memory), `cached`, or `streamed` "
            "(non-temporal stores, around the caches); [performance.md](performance.md)"),
    Setting("RINGCOMM_SPIN_US", lambda c: f"{c.spin_us:g}",
            "microseconds a waiting rank spins before it yields (0 to 6e7)"),
    Setting("RINGCOMM_YIELD_US", lambda c: f"{c.yield_us:g}",
            "microseconds it then yields before it sleeps (0 to 6e7)"),
    Setting("RINGCOMM_CHECK_AGREEMENT", lambda c: "1" if c.check_agreement else "0",
            "`0`: rooted calls (broadcast, reduce, scatter, gather) skip the agreement check (ceil(log2 n) "
            "rounds; at two ranks an empty message each way inside the call's schedule, and beyond, for tree "
            "broadcast and reduce, their covering form: docs/errors.md) that makes ranks "
            "disagreeing on the root raise; for measuring its cost; the same on every rank"),
    Setting("RINGCOMM_AUTOTUNE", lambda c: "1" if c.autotune else "0",
            "`1`: `auto` checks the model's pick against the calls' own times and, where they run more than 1.3x "
            "from its prediction, measures the candidates and keeps the fastest, again when load comes or goes "
            "(`comm.tuning()` shows it; [algorithms.md](algorithms.md#autotuning)); `0`: the model's pick always "
            "(the same reduction order on every run); the same on every rank"),
    Setting("RINGCOMM_HOST_ID", "unset",
            "overrides the host identity (hostname + boot id; network namespaces share both; at most 255 "
            "characters)", "python/ringcomm/bootstrap.py"),
    Setting("RINGCOMM_TRANSPORT", lambda c: c.transport,
            "`auto` (shm on one host, TCP between hosts), `shm`, `tcp` (every peer), `cuda_ipc` (GPU buffers "
            "over CUDA IPC among the ranks of one host, CPU buffers as auto; under `auto`, GPU buffers go over "
            "NCCL unless two ranks share a GPU, which cuda_ipc then serves: `python/ringcomm/cuda_ipc.py` "
            "`pick_gpu_transport`); also `init(transport=)`"),
    Setting("RINGCOMM_SOCKET_IFNAME", "the address that routes to `MASTER_ADDR` / the store's host",
            "interface(s) TCP listens on and advertises, e.g. `eth0` (comma list)", "python/ringcomm/bootstrap.py"),
    Setting("RINGCOMM_JOIN_TOKEN", "none",
            "`comm.grow()` admits only joiners that prove they hold this token (a challenge answered by HMAC; "
            "the token never enters the store); `init(join=...)` answers with it ([recovery.md](recovery.md))",
            "python/ringcomm/recovery.py"),
)

# The GPU path's settings ([gpus.md](gpus.md)); rank 0's hold for every rank.
GPU_SETTINGS = (
    Setting("RINGCOMM_GPU_ALGO", "auto",
            "`auto` (NCCL's collective except for bool, the bitwise ops and floating-point MIN/MAX), `nccl`, "
            "`ring` (ringcomm's schedules over NCCL send/recv); a call's `algo=` overrides it",
            "python/ringcomm/cuda.py"),
    Setting("RINGCOMM_GPU_CHUNK_BYTES", _gpu_chunk,
            "the ring family's chunk (a multiple of 64, 64 to 1 GiB)", "python/ringcomm/cuda.py"),
    Setting("RINGCOMM_NCCL_LIBRARY", "unset",
            "the NCCL library to load (default: the copy torch loaded, else the nvidia-nccl wheel's, else the "
            "system's `libnccl.so.2`)", "csrc/transport/nccl/nccl_lib.cpp"),
    Setting("RINGCOMM_IPC_ALGO", "auto",
            "all_reduce over cuda_ipc: `auto` (by size, below), `oneshot`, `twoshot` or `ring`",
            "python/ringcomm/cuda.py"),
    Setting("RINGCOMM_IPC_SLOT_BYTES", _gpu_default("slot_bytes"),
            "the most one point-to-point chunk over cuda_ipc moves (on the GPU the ring family's chunk, "
            "`RINGCOMM_GPU_CHUNK_BYTES`, unless this is set)", "python/ringcomm/cuda_ipc.py"),
    Setting("RINGCOMM_IPC_NSLOTS", _gpu_default("nslots"), "cuda_ipc slots per peer", "python/ringcomm/cuda_ipc.py"),
    Setting("RINGCOMM_IPC_STAGE_BYTES", _gpu_default("stage_bytes"),
            "the largest one-/two-shot all_reduce over cuda_ipc", "python/ringcomm/cuda_ipc.py"),
    Setting("RINGCOMM_IPC_ONESHOT_MAX_BYTES", _gpu_default("one_shot_max"),
            "all_reduce up to this size runs one-shot over cuda_ipc (not measured: `scripts/ipc_bench.py` "
            "prints the thresholds its latencies suggest)", "python/ringcomm/cuda_ipc.py"),
    Setting("RINGCOMM_IPC_TWOSHOT_MAX_BYTES", _gpu_default("two_shot_max"),
            "then two-shot up to this size, then the ring (not measured either)", "python/ringcomm/cuda_ipc.py"),
)

# Knobs for tests and diagnosis.
DEBUG_SETTINGS = (
    Setting("RINGCOMM_REDUCE_ISA", "unset",
            "`baseline` forces the portable reduction kernels instead of AVX2 (so tests can check both on one "
            "machine)", "csrc/reduce/cpu/dispatch.cpp"),
)

TABLE_BEGIN = "<!-- config-table: generated by scripts/gen_config_docs.py from python/ringcomm/config.py -->"
TABLE_END = "<!-- end config-table -->"


def markdown_table():
    """The tables of docs/configuration.md, from SETTINGS, GPU_SETTINGS and
    DEBUG_SETTINGS (defaults read from the native Config)."""
    cfg = _C.Config()
    out = []
    for title, group in (("Communicator", SETTINGS), ("GPU path", GPU_SETTINGS), ("Tests and diagnosis", DEBUG_SETTINGS)):
        out += ["", f"**{title}**", "", "| variable | meaning | default | read by |", "|---|---|---|---|"]
        for s in group:
            default = s.default(cfg) if callable(s.default) else s.default
            out.append(f"| `{s.name}` | {s.meaning} | {default} | `{s.read_by}` |")
    return "\n".join(out[1:]) + "\n"


_INT = re.compile(r"[+-]?[0-9]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _raw(name):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip()


def _env_int(name, default, lo, hi):
    raw = _raw(name)
    if raw is None:
        return default
    what = f"environment variable {name}"
    if not _INT.fullmatch(raw):
        raise ValueError(f"{what}={raw[:40]!r} is not an integer (expected {lo} to {hi})")
    if len(raw.lstrip("+-")) > 30:
        raise ValueError(f"{what} must be between {lo} and {hi}, got a {len(raw)}-digit number")
    return validate.index(int(raw), what, lo, hi)


def _env_float(name, default, lo, hi):
    raw = _raw(name)
    if raw is None:
        return default
    what = f"environment variable {name}"
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{what}={raw[:40]!r} is not a number") from None
    return validate.real(value, what, lo, hi)


def _env_choice(name, default, choices):
    raw = _raw(name)
    return default if raw is None else validate.choice(raw, f"environment variable {name}", choices)


def _algo(value, name):
    """One algorithm name for every op that has it, or "<op>:<name>,..." per op
    (checked by the native parser, comm/algo_choice.cpp, which the
    communicator uses too)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str (one of {', '.join(ALGOS)}, or op:name,...), "
                        f"got {type(value).__name__} {validate.show(value)}")
    text = value.strip()
    if len(text) > 512:
        raise ValueError(f"{name} is too long ({len(text)} characters)")
    try:
        _C.check_algo(text)
    except ValueError as e:
        raise ValueError(f"{name}={validate.show(value)}: {e} (names: {', '.join(ALGOS)})") from None
    return text


def _cost_model_setting():
    raw = _raw("RINGCOMM_COST_MODEL")
    if raw is None or raw.strip() in ("measure", "default"):
        return "measure" if raw is None else raw.strip()
    path = raw.strip()
    if len(path) > 4096 or _CONTROL.search(path):
        raise ValueError(f"environment variable RINGCOMM_COST_MODEL={validate.show(raw)}: not measure, default "
                         "or a file path")
    return path


def _env_timeout():
    raw = _raw("RINGCOMM_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable RINGCOMM_TIMEOUT={raw[:40]!r} is not a number of seconds") from None
    return validate.timeout_seconds(value, "environment variable RINGCOMM_TIMEOUT")


def _check_host_settings():
    """RINGCOMM_HOST_ID and RINGCOMM_SOCKET_IFNAME are read by bootstrap;
    refuse bad values here, before any peer sees them."""
    host = os.environ.get("RINGCOMM_HOST_ID")
    if host and (len(host) > MAX_HOST_ID or _CONTROL.search(host)):
        raise ValueError(f"environment variable RINGCOMM_HOST_ID must be at most {MAX_HOST_ID} characters "
                         f"without control characters, got {validate.show(host)}")
    names = os.environ.get("RINGCOMM_SOCKET_IFNAME", "").strip()
    if names:
        for name in (n.strip() for n in names.split(",")):
            if (not name or len(name.encode("utf-8", "replace")) > MAX_IFNAME_BYTES or name in (".", "..")
                    or "/" in name or re.search(r"\s", name) or _CONTROL.search(name)):
                raise ValueError(
                    f"environment variable RINGCOMM_SOCKET_IFNAME={validate.show(names)}: "
                    f"{validate.show(name)} is not an interface name (1 to {MAX_IFNAME_BYTES} bytes, "
                    "no '/' or whitespace; a comma list of names)")


def make_config(timeout=None, algo=None, transport=None):
    """The native Config for a new communicator (ValueError / TypeError
    naming the keyword or the environment variable for a bad setting)."""
    cfg = _C.Config()
    cfg.transport = (_env_choice("RINGCOMM_TRANSPORT", "auto", TRANSPORTS) if transport is None
                     else validate.choice(transport, "transport", TRANSPORTS))
    cfg.timeout_s = _env_timeout() if timeout is None else validate.timeout_seconds(timeout, "timeout")
    raw_algo = _raw("RINGCOMM_ALGO") if algo is None else algo
    cfg.algo = "auto" if raw_algo is None else _algo(raw_algo, "algo" if algo is not None else "environment variable RINGCOMM_ALGO")
    cfg.oneshot_max_bytes = _env_int("RINGCOMM_ONESHOT_MAX_BYTES", cfg.oneshot_max_bytes, 0, MAX_ONESHOT_BYTES)
    cfg.pull = _env_int("RINGCOMM_PULL", 1, 0, 1) == 1
    cfg.pull_min_bytes = _env_int("RINGCOMM_PULL_MIN_BYTES", cfg.pull_min_bytes, 0, MAX_PULL_MIN_BYTES)
    cfg.p2p_unexpected_bytes = _env_int("RINGCOMM_P2P_UNEXPECTED_MB", cfg.p2p_unexpected_bytes >> 20, 0,
                                        1 << 40) << 20
    cfg.slot_bytes = _env_int("RINGCOMM_SLOT_BYTES", cfg.slot_bytes, 64, MAX_SLOT_BYTES)
    if cfg.slot_bytes % 64:
        raise ValueError(f"environment variable RINGCOMM_SLOT_BYTES must be a multiple of 64 between 64 and "
                         f"1 GiB, got {cfg.slot_bytes}")
    cfg.nslots = _env_int("RINGCOMM_SLOTS", cfg.nslots, MIN_SLOTS, MAX_SLOTS)
    cfg.slot_stores = _env_choice("RINGCOMM_SLOT_STORES", "auto", SLOT_STORES)
    cfg.spin_us = _env_float("RINGCOMM_SPIN_US", cfg.spin_us, 0.0, MAX_WAIT_US)
    cfg.yield_us = _env_float("RINGCOMM_YIELD_US", cfg.yield_us, 0.0, MAX_WAIT_US)
    cfg.check_agreement = _env_int("RINGCOMM_CHECK_AGREEMENT", 1, 0, 1) == 1
    cfg.autotune = _env_int("RINGCOMM_AUTOTUNE", 1, 0, 1) == 1
    cfg.ring_order = _env_choice("RINGCOMM_RING_ORDER", "host", RING_ORDERS)
    cfg.plan_cache_entries = _env_int("RINGCOMM_PLAN_CACHE", cfg.plan_cache_entries, 0, MAX_PLAN_CACHE)
    cfg.cost_model = _cost_model_setting()
    _check_host_settings()
    return cfg

