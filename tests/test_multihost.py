"""Ranks on two "hosts": two network namespaces joined by a veth pair, each running
its own `torchrun --nnodes 2 --rdzv-backend c10d` (the real launcher), two ranks per
host. Ranks of one host talk over shared memory, ranks of different hosts over TCP.

Namespaces of one machine share the hostname and the kernel's boot id, which
ringcomm's host identity is made of (and they share /dev/shm too), so each
namespace sets RINGCOMM_HOST_ID to look like a host of its own.

Needs root and `ip` (iproute2); skips with the reason where namespaces cannot be made.
"""

import json
import os
import random
import signal
import subprocess
import sys

import pytest

import netns

HERE = os.path.dirname(os.path.abspath(__file__))
NPROC = 2  # ranks per host
HARD_TIMEOUT = 240.0
ADDRS = ("10.77.0.1", "10.77.0.2")


@pytest.fixture
def two_hosts():
    """Two namespaces joined by a veth pair (ADDRS); both are deleted afterwards."""
    with netns.two_hosts("rcmh", "rcv", ADDRS) as hosts:
        yield hosts


def _torchrun():
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "torch.distributed.run"]


def test_two_hosts_under_torchrun(two_hosts, tmp_path):
    names, veths = two_hosts
    port = random.randint(20000, 40000)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGCOMM_", "MASTER_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    procs = []
    logs = []
    try:
        for i, ns in enumerate(names):
            log = open(tmp_path / f"host{i}.log", "w")
            logs.append(log)
            # Host 0 advertises the address that routes to MASTER_ADDR (the default),
            # host 1 its veth interface by name.
            pick = [f"RINGCOMM_SOCKET_IFNAME={veths[i]}"] if i == 1 else []
            cmd = ["ip", "netns", "exec", ns, "env", f"RINGCOMM_HOST_ID=host{i}", *pick, *_torchrun(),
                   "--nnodes", "2", "--nproc-per-node", str(NPROC), "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"{ADDRS[0]}:{port}", "--rdzv-id", f"ringcomm-{port}",
                   # c10d decides who serves the rendezvous store, and what MASTER_ADDR
                   # is, from the hostname, which resolves to the root namespace's
                   # address here: say both, as on hosts whose FQDN does not resolve.
                   "--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", ADDRS[i],
                   "--max-restarts", "0", os.path.join(HERE, "multihost_prog.py"), str(tmp_path)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=HARD_TIMEOUT))
            except subprocess.TimeoutExpired:
                codes.append("hung")
    finally:
        for p in procs:  # torchrun and its workers share the session's process group
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
        for log in logs:
            log.close()
    out = "\n".join(f"--- host{i} (exit {c}):\n" + (tmp_path / f"host{i}.log").read_text()[-6000:]
                    for i, c in enumerate(codes))
    fails = []
    for rank in range(2 * NPROC):
        path = tmp_path / f"rank{rank}.json"
        if not path.exists():
            fails.append(f"rank {rank} wrote no report")
            continue
        report = json.loads(path.read_text())
        print(f"rank {rank}: {report['env']} transports {report.get('transports')}")
        fails += [f"rank {rank}: {f}" for f in report["fails"]]
    assert not fails and codes == [0, 0], "\n".join(fails[:40]) + "\n" + out
