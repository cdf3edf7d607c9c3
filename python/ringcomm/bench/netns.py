"""Several "hosts" on one Linux machine: network namespaces, each joined by a veth
pair to a Linux bridge that lives in a namespace of its own, addresses on one /24,
links optionally rate-shaped with tbf. For benchmarks/multihost.py and the tests
that cross a network (tests/netns.py). Needs root and iproute2 (`ip`, `tc`).

Nothing is made in the caller's namespace: both ends of every veth pair are
created inside the namespaces, so deleting the namespaces deletes everything.
Names carry the creating process's pid (`<prefix><pid><suffix>`), so that a later
run can remove what a run killed before its clean-up left (delete_stale).

Namespaces of one machine share the hostname, the kernel's boot id (ringcomm's
host identity) and /dev/shm: programs run in them set RINGCOMM_HOST_ID to look
like hosts of their own, and GLOO_SOCKET_IFNAME, since gloo otherwise takes the
address the hostname resolves to, which belongs to the root namespace.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator, List, Optional

# A namespace's host side of its veth pair; the same name in every namespace.
HOST_IFNAME = "eth0"
BRIDGE = "br0"
MAX_HOSTS = 254  # one /24
_TC_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)", re.IGNORECASE)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def ip(*args, check=True, timeout=30.0):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout, check=check)


def unavailable_reason(shaping: bool = False) -> Optional[str]:
    """Why namespaces (and tbf shaping, if asked) cannot be made here; None if they can."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if shaping and shutil.which("tc") is None:
        return "`tc` (iproute2) is not installed: links cannot be shaped"
    return None


def rate_bits(rate: str) -> int:
    """A tc rate ("1gbit", "10gbit", "500mbit") in bits per second; ValueError otherwise."""
    m = _TC_RATE.fullmatch(rate.strip())
    if not m:
        raise ValueError(f"rate {rate!r} is not a tc rate such as 1gbit, 10gbit or 500mbit")
    bits = int(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()])
    if bits < 8000:
        raise ValueError(f"rate {rate!r} is below 8kbit")
    return bits


def tbf_args(rate: str) -> List[str]:
    """`tc qdisc add ... root` arguments of a token bucket at `rate`. The bucket holds
    1 ms at the rate, and at least 64 KiB: one GSO segment of a veth passes whole
    (tbf splits larger ones). The queue holds 50 ms, then drops (TCP backs off)."""
    burst = max(rate_bits(rate) // 8 // 1000, 65536)
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]


def namespace_pids(ns: str) -> List[int]:
    out = ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace_processes(ns: str, grace_s: float = 0.0) -> None:
    """Stops every process left in namespace `ns`: SIGTERM, then SIGKILL after
    `grace_s` (at once when 0). Deleting a namespace does not end its processes."""
    sig = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
    for pid in namespace_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + grace_s
    while grace_s > 0 and namespace_pids(ns) and time.monotonic() < deadline:
        time.sleep(0.05)
    if grace_s > 0:
        kill_namespace_processes(ns)


def delete_namespace(ns: str) -> None:
    kill_namespace_processes(ns)
    ip("netns", "del", ns, check=False)


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def delete_stale(prefix: str, suffix: str) -> List[str]:
    """Deletes the namespaces `<prefix><pid><suffix>` (suffix: a regular expression)
    whose creating process `pid` is gone, with any process still running in them;
    returns their names."""
    listing = ip("netns", "list", check=False).stdout
    stale = []
    for name, pid in re.findall(rf"^({re.escape(prefix)}(\d+){suffix})\b", listing, re.MULTILINE):
        if not _running(int(pid)):
            delete_namespace(name)
            stale.append(name)
    return stale


@dataclass
class Host:
    index: int
    ns: str          # its network namespace
    addr: str        # its IPv4 address (/24)
    ifname: str      # its interface towards the bridge (HOST_IFNAME)

    def exec_prefix(self) -> List[str]:
        return ["ip", "netns", "exec", self.ns]


def host_names(prefix: str, count: int, pid: Optional[int] = None):
    """(bridge namespace, host namespaces) of the run of process `pid` (this one)."""
    base = f"{prefix}{os.getpid() if pid is None else pid}"
    return f"{base}br", [f"{base}h{i}" for i in range(count)]


STALE_SUFFIX = r"(?:br|h\d+)"  # the names host_names makes


@contextlib.contextmanager
def bridged_hosts(count: int, prefix: str, subnet: str = "10.78.0",
                  rate: Optional[str] = None) -> Iterator[List[Host]]:
    """`count` host namespaces `<prefix><pid>h<i>` with addresses `<subnet>.<i+1>`,
    each a veth pair to bridge BRIDGE in namespace `<prefix><pid>br`; with `rate`, a
    tbf on both ends of every pair (each end shapes what it sends: both directions).
    Deletes them all afterwards, also on an exception or Ctrl-C, processes left in
    them included. Raises RuntimeError where they cannot be made."""
    if not 1 <= count <= MAX_HOSTS:
        raise ValueError(f"count must be 1..{MAX_HOSTS}, got {count}")
    reason = unavailable_reason(shaping=rate is not None)
    if reason:
        raise RuntimeError(reason)
    shaping = tbf_args(rate) if rate is not None else None
    delete_stale(prefix, STALE_SUFFIX)
    bridge_ns, names = host_names(prefix, count)
    hosts = [Host(i, ns, f"{subnet}.{i + 1}", HOST_IFNAME) for i, ns in enumerate(names)]
    made: List[str] = []
    try:
        try:
            for ns in [bridge_ns, *names]:
                ip("netns", "add", ns)
                made.append(ns)
            ip("-n", bridge_ns, "link", "add", BRIDGE, "type", "bridge")
            ip("-n", bridge_ns, "link", "set", BRIDGE, "up")
            for h in hosts:
                port = f"vb{h.index}"
                ip("-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", h.ifname,
                   "netns", h.ns)
                ip("-n", bridge_ns, "link", "set", port, "master", BRIDGE)
                ip("-n", bridge_ns, "link", "set", port, "up")
                ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", h.ifname)
                ip("-n", h.ns, "link", "set", h.ifname, "up")
                ip("-n", h.ns, "link", "set", "lo", "up")
                if shaping:
                    for ns, dev in ((h.ns, h.ifname), (bridge_ns, port)):
                        subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *shaping],
                                       capture_output=True, text=True, timeout=30, check=True)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"cannot create the namespaces: {' '.join(e.cmd)}: "
                               f"{(e.stderr or '').strip()}") from None
        yield hosts
    finally:
        # A second Ctrl-C must not cut the clean-up short: it is held until the end.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for ns in reversed(made):
                delete_namespace(ns)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
