"""Communicator settings: keyword arguments of init() first, then environment
variables, then defaults. An empty variable counts as unset; a bad value is a
ValueError naming the variable (a keyword of the wrong type a TypeError).

RINGCOMM_TIMEOUT           seconds any blocking wait may take (default 300; > 0, at most 30 days)
RINGCOMM_ALGO              auto | one name, forced for every op that has it: ring, oneshot (all_reduce),
                           pull (every collective and send/recv by single-copy pulls, where the OS
                           allows), recursive_doubling, rabenseifner (all_reduce), tree (broadcast, reduce),
                           bruck (all_gather), hierarchical (all_reduce, broadcast, reduce,
                           all_gather, reduce_scatter across hosts),
                           direct (scatter, gather, all_to_all, barrier) |
                           op:name,... per op (e.g. all_reduce:recursive_doubling,broadcast:tree)
RINGCOMM_PULL              0 disables single-copy pulls (default 1; 0 or 1)
RINGCOMM_PULL_MIN_BYTES    send/recv of at least this size pull (default 16 MiB; 0 to 2**63 - 1)
RINGCOMM_P2P_UNEXPECTED_MB MiB of messages received before their recv was posted (another tag's, say)
                           a rank holds, all peers together (default 256; 0 to 2**40)
RINGCOMM_ONESHOT_MAX_BYTES auto: largest all_reduce done one-shot (default 65536; 0 to 1 GiB)
RINGCOMM_SLOT_BYTES        bytes per pipelined segment (default 131072; a multiple of 64, 64 to 1 GiB)
RINGCOMM_SLOTS             segments in flight per peer (default 16; 3 to 4096)
RINGCOMM_SPIN_US           microseconds a waiting rank spins before it yields (0 to 6e7)
RINGCOMM_YIELD_US          microseconds it yields before it sleeps (0 to 6e7)
RINGCOMM_CHECK_AGREEMENT   0: rooted calls (broadcast, reduce, scatter, gather) skip the agreement check
                           that makes ranks disagreeing on the root raise (default 1; for measuring
                           its cost; every rank must use the same setting)
RINGCOMM_COST_MODEL        what `auto` picks with: measure (default: links measured at init, ~50 ms at
                           most) | default (built-in figures) | a file `ringcomm-bench --calibrate` wrote
                           (read by rank 0 only; every rank must use the same setting)
RINGCOMM_RING_ORDER        host (default: each host's ranks next to each other) | rank (rank order)
RINGCOMM_PLAN_CACHE        plans a communicator keeps per call signature, run as they stand on each
                           repeated call's buffers (default 64; 0 plans every call afresh; at most 4096)
RINGCOMM_HOST_ID           overrides the host identity (hostname + boot id; at most 255 characters)
RINGCOMM_TRANSPORT         auto (shared memory on one host, TCP between hosts) | shm | tcp (every peer) |
                           cuda_ipc (GPU buffers over CUDA IPC among the ranks of one host, CPU buffers as
                           auto; under auto, GPU buffers go over NCCL unless two ranks share a GPU, which
                           cuda_ipc then serves: ringcomm/cuda_ipc.py pick_gpu_transport)
RINGCOMM_SOCKET_IFNAME     interface(s) TCP listens on and advertises, e.g. eth0 (comma list; default:
                           the address that routes to MASTER_ADDR / the store's host)
"""
import os
import re

from ringcomm import _C, validate

DEFAULT_TIMEOUT_S = 300.0
ALGOS = ("auto", "ring", "oneshot", "pull", "recursive_doubling", "rabenseifner", "tree", "bruck",
         "hierarchical", "direct")
RING_ORDERS = ("host", "rank")
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
    cfg.spin_us = _env_float("RINGCOMM_SPIN_US", cfg.spin_us, 0.0, MAX_WAIT_US)
    cfg.yield_us = _env_float("RINGCOMM_YIELD_US", cfg.yield_us, 0.0, MAX_WAIT_US)
    cfg.check_agreement = _env_int("RINGCOMM_CHECK_AGREEMENT", 1, 0, 1) == 1
    cfg.ring_order = _env_choice("RINGCOMM_RING_ORDER", "host", RING_ORDERS)
    cfg.plan_cache_entries = _env_int("RINGCOMM_PLAN_CACHE", cfg.plan_cache_entries, 0, MAX_PLAN_CACHE)
    cfg.cost_model = _cost_model_setting()
    _check_host_settings()
    return cfg
