"""benchmarks/multihost.py, the multi-host harness, at its smallest useful size: 2
"hosts" (network namespaces on one bridge) x 1 rank, and x 2 ranks interleaved
across the hosts, two tiny sizes, ringcomm's ring and auto next to gloo. Checks
that the table has every row, that the bench's own check passed everywhere, that
ringcomm grouped the interleaved ranks into their real hosts, and that a run that
hangs fails clearly and leaves no namespace or process behind.

Needs root and iproute2; skips with the reason otherwise.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ringcomm.bench import netns

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "benchmarks", "multihost.py")
HARD_TIMEOUT_S = 150
TINY_BENCH = ["--", "-n", "2", "-w", "1", "--budget", "0.01", "--batch-ms", "0.2"]


def _harness_module():
    spec = importlib.util.spec_from_file_location("multihost", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


mh = _harness_module()


def _needs_namespaces():
    reason = netns.unavailable_reason(shaping=True)
    if reason:
        pytest.skip(reason)


def _run(args, tmp_path, timeout=HARD_TIMEOUT_S):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGCOMM_", "MASTER_"))}
    proc = subprocess.Popen([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the harness cleans up on SIGTERM as on Ctrl-C
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the harness ran past {timeout} s:\n{out[-4000:]}\n{err[-4000:]}")
    return proc, out, err


def _left_behind(pid, result):
    """Namespaces of harness `pid`, and processes still running a bench of its runs
    (their command lines name the run's directory)."""
    cmd = result["runs"][0]["bench_command"]
    marker = os.path.dirname(os.path.dirname(cmd[cmd.index("--json") + 1]))
    names = [n for n in netns.ip("netns", "list", check=False).stdout.split()
             if n.startswith(f"{mh.PREFIX}{pid}")]
    procs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        procs.append(int(entry))
            except OSError:
                pass
    return names, procs


# --------------------------------------------------------------------------- pure parts

def test_placements_and_the_host_grouping_they_expect():
    contiguous, interleaved = mh.Config(2, 3, "contiguous"), mh.Config(2, 3, "interleaved")
    assert [contiguous.host_of(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]
    assert [interleaved.host_of(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert mh.expected_groups(contiguous) == "0,1,2 | 3,4,5"
    assert mh.expected_groups(interleaved) == "0,2,4 | 1,3,5"
    # One rank per host: the placements coincide, and run once.
    assert mh.configs([2, 4], [1, 2], ["contiguous", "interleaved"]) == [
        mh.Config(2, 1, "contiguous"), mh.Config(2, 2, "contiguous"),
        mh.Config(2, 2, "interleaved"), mh.Config(4, 1, "contiguous"),
        mh.Config(4, 2, "contiguous"), mh.Config(4, 2, "interleaved")]


def test_cpus_are_dealt_out_to_the_hosts(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert [mh.host_cpus(i, 2) for i in range(2)] == [[0, 2], [1, 3]]
    assert [mh.host_cpus(i, 4) for i in range(4)] == [[0], [1], [2], [3]]
    assert [mh.host_cpus(i, 6) for i in range(6)] == [[0], [1], [2], [3], [0], [1]]
    assert mh.host_cpus(0, 1) == [0, 1, 2, 3]


def test_interleaved_rank_renumbers_torchruns_ranks():
    spec = importlib.util.spec_from_file_location(
        "interleaved_rank", os.path.join(HERE, "..", "benchmarks", "interleaved_rank.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    env = {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "4"}
    got = {(node, local): mod.interleaved_rank(dict(env, GROUP_RANK=str(node), LOCAL_RANK=str(local)))
           for node in range(4) for local in range(2)}
    assert sorted(got.values()) == list(range(8))
    assert [got[(node, 0)] for node in range(4)] == [0, 1, 2, 3]
    assert [got[(node, 1)] for node in range(4)] == [4, 5, 6, 7]
    with pytest.raises(SystemExit, match="not 3 hosts x 2"):
        mod.interleaved_rank(dict(env, GROUP_WORLD_SIZE="3", GROUP_RANK="0", LOCAL_RANK="0"))


def test_harness_rejects_bad_flags(capsys):
    for argv in (["--placement", "diagonal"], ["--rate", "fast"], ["--hosts", "0"],
                 ["--algos", "", "--no-gloo"], ["-b", "1M", "-e", "8"], ["--env", "NOVALUE"],
                 ["--env", "=x"], ["--env", "A B=1"]):
        with pytest.raises(SystemExit) as e:
            mh.parse_args(argv)
        assert e.value.code == 2, argv
    args = mh.parse_args(["--algos", "ring;all_reduce:rabenseifner,broadcast:tree auto",
                          "--out", "x/y.json", "--", "-n", "3"])
    assert args.algos == ["ring", "all_reduce:rabenseifner,broadcast:tree", "auto"]
    assert args.out == "x/y" and args.bench_extra == ["-n", "3"]
    assert mh.parse_args([]).algos == ["ring", "auto"]
    # --env reaches every host, past the RINGCOMM_* the harness drops from its own environment.
    mh.parse_args(["--env", "RINGCOMM_RING_ORDER=rank", "--env", "X_Y=a=b"])
    env = mh.host_env(mh.netns.Host(index=1, ns="ns", addr="10.0.0.2", ifname="eth1"))
    assert env["RINGCOMM_RING_ORDER"] == "rank" and env["X_Y"] == "a=b" and env["RINGCOMM_HOST_ID"] == "host1"
    mh.parse_args([])


# --------------------------------------------------------------------------- namespaces

def test_bridged_hosts_shape_both_ends_and_are_removed():
    _needs_namespaces()
    with netns.bridged_hosts(3, "rcmt", "10.79.0", rate="10gbit") as hosts:
        bridge_ns, names = netns.host_names("rcmt", 3)
        assert [h.ns for h in hosts] == names and hosts[2].addr == "10.79.0.3"
        for h in hosts:
            for ns, dev in ((h.ns, h.ifname), (bridge_ns, f"vb{h.index}")):
                shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                                       capture_output=True, text=True, timeout=30).stdout
                assert "tbf" in shown and "10Gbit" in shown, (ns, dev, shown)
        # Host 2 reaches host 0 through the bridge (a refused connection is an answer).
        probe = ("import socket; s = socket.socket(); s.settimeout(5)\n"
                 "try: s.connect(('10.79.0.1', 9))\nexcept ConnectionRefusedError: print('reached')")
        got = subprocess.run([*hosts[2].exec_prefix(), sys.executable, "-c", probe],
                             capture_output=True, text=True, timeout=30)
        assert got.stdout.strip() == "reached", got.stderr
    left = [n for n in netns.ip("netns", "list").stdout.split() if n.startswith(f"rcmt{os.getpid()}")]
    assert left == []


def test_shaped_links_hold_traffic_to_the_rate():
    _needs_namespaces()
    nbytes = 1 << 20  # at 40 Mbit/s (5 MB/s) past the 64 KiB bucket: ~0.19 s; unshaped: ~1 ms
    with netns.bridged_hosts(2, "rcmt", "10.79.0", rate="40mbit") as hosts:
        server = subprocess.Popen(
            [*hosts[0].exec_prefix(), sys.executable, "-c",
             "import socket\ns = socket.create_server(('10.79.0.1', 5001)); print('up', flush=True)\n"
             "c, _ = s.accept(); n = 0\nwhile (b := c.recv(1 << 16)): n += len(b)\nprint(n)"],
            stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "up"
            client = subprocess.run(
                [*hosts[1].exec_prefix(), sys.executable, "-c",
                 "import socket, time\nc = socket.create_connection(('10.79.0.1', 5001))\n"
                 f"t = time.perf_counter(); c.sendall(bytes({nbytes})); c.shutdown(socket.SHUT_WR)\n"
                 "c.recv(1); print(time.perf_counter() - t)"],
                capture_output=True, text=True, timeout=30)
            assert server.wait(timeout=30) == 0 and int(server.stdout.read()) == nbytes
        finally:
            server.kill()
            server.wait()
            server.stdout.close()
        assert float(client.stdout) > 0.1, client.stdout + client.stderr
        bridge_ns, _ = netns.host_names("rcmt", 2)
        for ns, dev in ((hosts[1].ns, hosts[1].ifname), (bridge_ns, "vb0")):  # both hops shaped it
            shown = subprocess.run(["tc", "-s", "-n", ns, "qdisc", "show", "dev", dev],
                                   capture_output=True, text=True, timeout=30).stdout
            assert int(shown.split("Sent ")[1].split()[0]) >= nbytes, (ns, dev, shown)


def test_two_hosts_one_and_two_ranks_interleaved(tmp_path):
    _needs_namespaces()
    out = tmp_path / "mh"
    args = ["--hosts", "2", "--ranks-per-host", "1,2", "--placement", "interleaved",
            "--algos", "ring auto", "-b", "8", "-e", "1K", "-f", "128", "--rate", "10gbit", "--calibrate",
            "--calibrate-runs", "1", "--calibrate-passes", "1",  # one of each: the file, not its precision
            "--out", str(out), "--launch-timeout", "90", "--call-timeout", "60", *TINY_BENCH]
    proc, stdout, stderr = _run(args, tmp_path)
    assert proc.returncode == 0, stdout[-4000:] + stderr[-8000:]
    result = json.loads((tmp_path / "mh.json").read_text())
    assert result["failures"] == [] and len(result["runs"]) == 2
    want = {(r, place, size, algo) for r, place in ((1, "contiguous"), (2, "interleaved"))
            for size in (8, 1024) for algo in ("ring", "auto", "gloo")}
    got = {(row["ranks_per_host"], row["placement"], row["size_bytes"], row["algorithm"])
           for row in result["rows"]}
    assert got == want and len(result["rows"]) == len(want)
    for row in result["rows"]:
        assert row["wrong"] == 0 and row["time_us"] > 0 and row["hosts"] == 2, row
    usable = sorted(os.sched_getaffinity(0))
    assert result["runs"][0]["cpus"] == [mh.host_cpus(i, 2) for i in range(2)]
    assert sorted(c for cpus in result["runs"][0]["cpus"] for c in cpus) == usable
    interleaved = result["runs"][1]["report"]
    assert interleaved["config"]["rank_hosts"] == ["host0", "host1", "host0", "host1"]
    assert interleaved["backends"]["ringcomm[ring]"]["hosts"] == "0,2 | 1,3"
    assert interleaved["backends"]["ringcomm[auto]"]["algo"] == "auto"
    # --calibrate: each configuration's parameter file, measured on its hosts, used by its runs.
    from ringcomm import cost_model

    for run, (per, place) in zip(result["runs"], ((1, "contiguous"), (2, "interleaved"))):
        path = tmp_path / f"mh_2x{per}_{place}_model.json"
        params = cost_model.load(str(path))
        assert params["fit_for"] == [2 * per, 2] and "all_reduce:ring" in params["fit"], params
        assert run["report"]["backends"]["ringcomm[auto]"]["cost_model"].startswith("file"), run["report"]["backends"]
    text = (tmp_path / "mh.txt").read_text()
    assert result["cpu_model"] and f"# CPU: {result['cpu_model']}" in text
    assert "# command: " in text and "--placement interleaved" in text and "tbf 10gbit" in text
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(body) == len(want)
    assert _left_behind(proc.pid, result) == ([], [])


def test_a_run_that_hangs_fails_clearly_and_cleans_up(tmp_path):
    _needs_namespaces()
    # Importing torch alone takes longer than this: every host is still running.
    proc, stdout, stderr = _run(["--hosts", "2", "--algos", "ring", "--no-gloo", "-b", "8",
                                 "-e", "8", "--out", str(tmp_path / "mh"), "--launch-timeout",
                                 "0.5", *TINY_BENCH], tmp_path, timeout=60)
    assert proc.returncode == 1, stdout + stderr
    result = json.loads((tmp_path / "mh.json").read_text())
    assert result["failures"] == [f"2 hosts x 1 contiguous, run 1: host {i} hung: killed after 0.5 s"
                                  for i in range(2)]
    assert "FAILED" in stderr and "# FAILED 2 hosts x 1 contiguous" in stdout
    assert _left_behind(proc.pid, result) == ([], [])
