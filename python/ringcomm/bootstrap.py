"""Rendezvous through a c10d Store: who the ranks are, where they run, and the
names of their shared segments. ringcomm brings no store of its own: it uses
torch.distributed.TCPStore (as torchrun sets it up) or any store passed in.
"""
import ipaddress
import json
import os
import secrets
import socket
import time
from datetime import timedelta

from ringcomm import validate
from ringcomm.errors import RingcommError, TimeoutError


def host_identity():
    """hostname + boot id: ranks with equal identities share /dev/shm.

    Network namespaces (and containers sharing a kernel) see the same hostname
    and boot id; set RINGCOMM_HOST_ID to tell them apart where they must talk
    over TCP.
    """
    override = os.environ.get("RINGCOMM_HOST_ID")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


def draw_secret():
    """The secret every TCP connection of a communicator presents first (hex)."""
    return secrets.token_hex(32)


def socket_address(store=None):
    """The IP address this rank listens on and advertises to its TCP peers.

    RINGCOMM_SOCKET_IFNAME names the interface (a comma list: the first that
    has an IPv4 address), as GLOO_SOCKET_IFNAME does; otherwise the source
    address of the route to the rendezvous host (MASTER_ADDR, else the
    store's host, else this hostname's address), which is right inside
    network namespaces and containers too; loopback as the last resort.
    """
    names = os.environ.get("RINGCOMM_SOCKET_IFNAME", "").strip()
    if names:
        for name in (n.strip() for n in names.split(",")):
            addr = _interface_address(name)
            if addr:
                return addr
        try:
            present = ", ".join(n for _, n in socket.if_nameindex())
        except OSError:
            present = "?"
        raise RingcommError(
            f"ringcomm: RINGCOMM_SOCKET_IFNAME={names!r}: no such interface with an IPv4 address "
            f"on this host (interfaces: {present})"
        )
    for host in _rendezvous_hosts(store):
        addr = _route_source(host)
        if addr and _is_loopback(addr) and host != "localhost" and not _is_ip(host):
            # A name that this host resolves to itself (Debian's 127.0.1.1
            # entry for the hostname) may name a real address on the others:
            # advertise the default route's source instead, where there is one.
            addr = _route_source("192.0.2.1") or addr  # TEST-NET-1: no packet is sent
        if addr:
            return addr
    return "127.0.0.1"


def _is_ip(text):
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _is_loopback(addr):
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def _interface_address(name):
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _rendezvous_hosts(store):
    hosts = []
    if os.environ.get("MASTER_ADDR"):
        hosts.append(os.environ["MASTER_ADDR"])
    seen = 0
    while store is not None and seen < 8:  # PrefixStore wraps the TCPStore
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            hosts.append(host)
            break
        store = getattr(store, "underlying_store", None)
        seen += 1
    hosts.append(socket.gethostname())
    return hosts


def _route_source(host):
    """This host's address on the route to `host` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(host, 9, 0, socket.SOCK_DGRAM)
    except OSError:
        return None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)  # IPv4 first
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.connect(addr)
                return s.getsockname()[0]
            except OSError:
                continue
    return None


def attempt():
    """A store prefix part for this launch attempt: "" or "restart<N>/" under
    torchrun --max-restarts (TORCHELASTIC_RESTART_COUNT). torchrun's agent
    keeps its store across restarts: without it, the restarted workers would
    read the records of the attempt before (segments of dead processes)."""
    raw = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    if not raw or raw == "0":
        return ""
    if not raw.isdigit() or len(raw) > 9:
        raise ValueError(f"environment variable TORCHELASTIC_RESTART_COUNT={raw!r} is not a restart count")
    return f"restart{int(raw)}/"


def env_int(name):
    raw = os.environ.get(name)
    if raw is None:
        raise ValueError(
            f"{name} is not set: pass rank=/world_size= to ringcomm.init() or launch with torchrun"
        )
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def store_from_env(rank, world_size, timeout_s):
    """The TCPStore torchrun's MASTER_ADDR / MASTER_PORT describe."""
    addr = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError(
            "MASTER_ADDR and MASTER_PORT are not set: pass store= to ringcomm.init() or launch with torchrun"
        )
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise RingcommError(
            "ringcomm.init() without store= needs torch for its TCPStore (pip install torch); "
            "or pass any object with set/get/wait/check as store="
        ) from None
    # torchrun's agent already serves the store at MASTER_PORT when it says so.
    agent_store = _agent_store()
    master = rank == 0 and not agent_store
    t0 = time.monotonic()
    try:
        return TCPStore(
            addr,
            int(port),
            world_size,
            is_master=master,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except Exception as e:  # noqa: BLE001 - torch's store errors (DistNetworkError, DistStoreError, ...)
        where = f"{addr}:{port} (MASTER_ADDR:MASTER_PORT)"
        if master:
            raise RingcommError(f"ringcomm: rank 0 could not serve the store at {where}: {e}") from None
        host = "torchrun's agent" if agent_store else "rank 0"
        took = time.monotonic() - t0
        err = TimeoutError if took >= 0.9 * timeout_s else RingcommError
        raise err(
            f"ringcomm: rank {rank} could not reach the store at {where} in {took:.3g} s; {host} serves it: "
            f"did {host} start (and stay up), and do all ranks agree on MASTER_ADDR and MASTER_PORT? "
            f"(the store said: {_first_line(e)})"
        ) from None


def _agent_store():
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def _first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def store_host(store):
    """Who serves `store`, for the errors of a store that failed: the TCPStore
    at MASTER_ADDR:MASTER_PORT is served by rank 0 (or by torchrun's agent);
    '' for stores ringcomm knows nothing about."""
    for _ in range(8):  # PrefixStores wrap the TCPStore
        if store is None:
            return ""
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and host and isinstance(port, int):
            break
        store = getattr(store, "underlying_store", None)
    else:
        return ""
    where = f"{host}:{port}"
    if host == os.environ.get("MASTER_ADDR") and str(port) == os.environ.get("MASTER_PORT"):
        if _agent_store():
            return f"the store at {where} is served by torchrun's agent: did the agent exit?"
        return f"the store at {where} (MASTER_ADDR:MASTER_PORT) is served by rank 0: did rank 0 exit?"
    return f"the store is a TCPStore at {where}: did the process serving it exit?"


def store_failed(what, store, e):
    """The RingcommError for a store call that raised `e`."""
    host = store_host(store)
    return RingcommError(f"ringcomm: {what}: the store failed: {_first_line(e)}" + (f"; {host}" if host else ""))


# Store waits poll store.check (no blocking store.wait: torch's stores log a
# warning for every wait that times out), backing off from 1 ms to 50 ms, so
# that Ctrl-C (delivered between polls) and dead peers (`alive`) are noticed
# within a fraction of a second rather than at the timeout.
_POLL_MIN_S = 0.001
_POLL_MAX_S = 0.05


def wait_keys(store, keys, timeout_s, what, rank, alive=None):
    """Waits until every key exists; TimeoutError names the missing ones.
    `alive(missing)`, when given, runs between polls and raises for a dead peer;
    missing(r) tells whether rank r's key is still missing (one store query,
    asked only for the ranks alive() wonders about)."""
    deadline = time.monotonic() + timeout_s
    pause = _POLL_MIN_S
    while True:
        try:
            if store.check(keys):
                return
        except Exception as e:  # noqa: BLE001 - the store's own error types
            raise store_failed(what, store, e) from e
        now = time.monotonic()
        if now >= deadline:
            missing = [k for k in keys if not _has(store, k)]
            names = ", ".join(k.rsplit("/", 1)[-1] for k in missing[:16])
            if len(missing) > 16:
                names += f" and {len(missing) - 16} more"
            raise TimeoutError(
                f"ringcomm: init on rank {rank} timed out after {timeout_s:.3g} s {what}; "
                f"missing rank(s): {names} (did every rank call init / split?)"
            ) from None
        if alive is not None and pause >= _POLL_MAX_S / 2:
            by_rank = {k.rsplit("/", 1)[-1]: k for k in keys}
            alive(lambda r: str(r) in by_rank and not _has(store, by_rank[str(r)]))
        time.sleep(min(pause, max(0.0, deadline - now)))
        pause = min(pause * 2, _POLL_MAX_S)


def _has(store, key):
    try:
        return bool(store.check([key]))
    except Exception:
        return False


def exchange(store, prefix, rank, world_size, info, timeout_s, schema=None, alive=None, members=None):
    """Publishes this rank's info and returns every member's (all ranks by
    default), by rank: a list, or a dict when `members` is given. With a
    `schema` (validate.record) each record is checked like socket data."""
    what = "waiting for the other ranks to join"
    _store_call(what, store, store.set, f"{prefix}/info/{rank}", json.dumps(info))
    ranks = list(range(world_size)) if members is None else list(members)
    keys = [f"{prefix}/info/{r}" for r in ranks]
    wait_keys(store, keys, timeout_s, what, rank, alive)
    got = {}
    for r, k in zip(ranks, keys):
        raw = _store_call(what, store, store.get, k)
        if schema is None:
            try:
                got[r] = json.loads(_text(raw))
            except (ValueError, TypeError) as e:
                raise RingcommError(f"ringcomm: the record rank {r} published in the store is malformed: {e}") from None
        else:
            got[r] = validate.record(raw, r, schema)
    return [got[r] for r in ranks] if members is None else got


def _store_call(what, store, fn, *args):
    try:
        return fn(*args)
    except RingcommError:
        raise
    except Exception as e:  # noqa: BLE001 - the store's own error types
        raise store_failed(what, store, e) from e


def _text(value):
    # torch's stores return bytes; a plain Python store may hand back the str it was given.
    return value if isinstance(value, str) else bytes(value).decode()


def barrier(store, prefix, name, rank, world_size, timeout_s, members=None, alive=None):
    _store_call(f"waiting for the other ranks ({name})", store, store.set, f"{prefix}/{name}/{rank}", "1")
    ranks = range(world_size) if members is None else members
    keys = [f"{prefix}/{name}/{r}" for r in ranks]
    wait_keys(store, keys, timeout_s, f"waiting for the other ranks ({name})", rank, alive)


def pid_namespace():
    """The inode of this process's pid namespace (0 if unknown): pids of
    peers in other namespaces mean nothing here."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def process_gone(pid):
    """Whether process `pid` (of this pid namespace) has exited (or is a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] in "ZX"
    except (OSError, ValueError, IndexError):
        return False


def liveness_check(rank, infos, members):
    """An `alive` callback for wait_keys: raises naming a local peer (same
    host and pid namespace) whose process died before it published."""
    mine = infos[rank]
    watched = [(r, infos[r]["pid"]) for r in members
               if r != rank and infos[r].get("pidns") == mine.get("pidns") and mine.get("pidns")]

    def alive(missing):
        for r, pid in watched:
            if process_gone(pid) and missing(r):
                raise RingcommError(f"ringcomm: rank {r} (pid {pid}) died during init; rank {rank} gives up")

    return alive
