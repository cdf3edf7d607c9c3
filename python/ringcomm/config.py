"""Communicator settings: keyword arguments of init() first, then environment
variables, then defaults.

RINGCOMM_TIMEOUT           seconds any blocking wait may take (default 300)
RINGCOMM_ALGO              auto | ring | oneshot (all_reduce) | pull (every collective
                           and send/recv by single-copy pulls, where the OS allows)
RINGCOMM_PULL              0 disables single-copy pulls (default 1)
RINGCOMM_PULL_MIN_BYTES    send/recv of at least this size pull (default 16 MiB)
RINGCOMM_ONESHOT_MAX_BYTES auto: largest all_reduce done one-shot (default 65536)
RINGCOMM_SLOT_BYTES        bytes per pipelined segment (default 131072)
RINGCOMM_SLOTS             segments in flight per peer (default 16, at least 3)
RINGCOMM_SPIN_US           microseconds a waiting rank spins before it yields
RINGCOMM_YIELD_US          microseconds it yields before it sleeps
RINGCOMM_HOST_ID           overrides the host identity (hostname + boot id)
RINGCOMM_TRANSPORT         auto (shared memory on one host, TCP between hosts) | shm | tcp (every peer)
RINGCOMM_SOCKET_IFNAME     interface(s) TCP listens on and advertises, e.g. eth0 (comma list; default:
                           the address that routes to MASTER_ADDR / the store's host)
"""
import os

from ringcomm import _C
from ringcomm.work import seconds

DEFAULT_TIMEOUT_S = 300.0
ALGOS = ("auto", "ring", "oneshot", "pull")
TRANSPORTS = ("auto", "shm", "tcp")


def _env(name, convert, default):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid {convert.__name__}") from None


def make_config(timeout=None, algo=None, transport=None):
    """The native Config for a new communicator."""
    cfg = _C.Config()
    cfg.transport = transport if transport is not None else _env("RINGCOMM_TRANSPORT", str, "auto")
    if cfg.transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {cfg.transport!r}")
    t = seconds(timeout)
    cfg.timeout_s = t if t is not None else _env("RINGCOMM_TIMEOUT", float, DEFAULT_TIMEOUT_S)
    if cfg.timeout_s <= 0:
        raise ValueError(f"timeout must be positive, got {cfg.timeout_s}")
    cfg.algo = algo if algo is not None else _env("RINGCOMM_ALGO", str, "auto")
    if cfg.algo not in ALGOS:
        raise ValueError(f"algo must be one of {', '.join(ALGOS)}, got {cfg.algo!r}")
    cfg.oneshot_max_bytes = _env("RINGCOMM_ONESHOT_MAX_BYTES", int, cfg.oneshot_max_bytes)
    cfg.pull = _env("RINGCOMM_PULL", int, 1) != 0
    cfg.pull_min_bytes = _env("RINGCOMM_PULL_MIN_BYTES", int, cfg.pull_min_bytes)
    cfg.slot_bytes = _env("RINGCOMM_SLOT_BYTES", int, cfg.slot_bytes)
    if cfg.slot_bytes < 64 or cfg.slot_bytes % 64 or cfg.slot_bytes > (1 << 30):
        raise ValueError(f"RINGCOMM_SLOT_BYTES must be a multiple of 64 between 64 and 1 GiB, got {cfg.slot_bytes}")
    cfg.nslots = _env("RINGCOMM_SLOTS", int, cfg.nslots)
    if not 3 <= cfg.nslots <= 4096:
        raise ValueError(f"RINGCOMM_SLOTS must be between 3 and 4096, got {cfg.nslots}")
    cfg.spin_us = _env("RINGCOMM_SPIN_US", float, cfg.spin_us)
    cfg.yield_us = _env("RINGCOMM_YIELD_US", float, cfg.yield_us)
    return cfg
