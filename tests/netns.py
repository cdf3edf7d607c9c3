"""Two "hosts" on one machine: network namespaces joined by a veth pair, for the
tests that cross a network (test_multihost, test_netfault). Needs root and `ip`
(iproute2); skip_reason() says why not. (Bridged topologies of more hosts:
ringcomm.bench.netns, which this shares its plumbing with.)"""

import contextlib
import os
import subprocess

import pytest

from ringcomm.bench.netns import delete_stale, ip, unavailable_reason


def skip_reason():
    return unavailable_reason()


@contextlib.contextmanager
def two_hosts(prefix, veth_prefix, addrs, tag=""):
    """Namespaces `prefix<pid><tag>a` / `...b` joined by a veth pair, addresses
    `addrs` (/24); yields (names, veths). Both are deleted afterwards, also when
    the test fails; skips the test when they cannot be made."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    delete_stale(prefix, "[a-z]*[ab]")
    base = f"{os.getpid()}{tag}"
    names = [f"{prefix}{base}a", f"{prefix}{base}b"]
    veths = [f"{veth_prefix}{base}a"[-15:], f"{veth_prefix}{base}b"[-15:]]  # interface names: 15 characters at most
    made = []
    try:
        try:
            for ns in names:
                ip("netns", "add", ns)
                made.append(ns)
            ip("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])
            for ns, dev, addr in zip(names, veths, addrs):
                ip("link", "set", dev, "netns", ns)
                ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                ip("-n", ns, "link", "set", dev, "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as e:
            pytest.skip(f"cannot create network namespaces here: {' '.join(e.cmd)}: {e.stderr.strip()}")
        yield names, veths
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and so the pair
            ip("netns", "del", ns, check=False)
        ip("link", "del", veths[0], check=False)  # still in the root namespace if a move failed
