"""scripts/gpu_check.sh on this GPU-less machine, as far as a CPU gets: its argument
handling, its two outputs (summary.txt and the archive of every log), that it fails
saying plainly that no GPU was found (skipped GPU tests count as failures, never as a
pass), and that a step that hangs is cut at the budget with its log kept.
scripts/gpu_check_report.py's verdicts on JUnit reports, and scripts/gpu_env.py's
reading of /proc/self/maps, are checked on their own."""

import os
import stat
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest

import ringcomm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu_check.sh")
sys.path.insert(0, os.path.join(REPO, "scripts"))

import gpu_check_report  # noqa: E402
import gpu_env  # noqa: E402


def _run(args, timeout=150, python=sys.executable, cwd=None, path=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    env["PYTHON"] = python
    if path is not None:
        env["PATH"] = path
    t = time.monotonic()
    r = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=timeout, env=env,
                       cwd=cwd or REPO)
    return r, time.monotonic() - t


def _archive(out):
    with tarfile.open(os.path.join(out, "gpu_check.tar.gz")) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("args,says", [
    (["--bogus"], "unknown option --bogus"),
    (["--budget"], "--budget needs a number"),
    (["--budget", "abc"], "whole number of seconds"),
    (["--budget=5"], "between 20 and 470"),
    (["--budget", "600"], "between 20 and 470"),
    (["a", "b"], "one OUT_DIR at most"),
])
def test_bad_arguments_are_a_usage_error(tmp_path, args, says):
    r, _ = _run(args, timeout=30, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert says in r.stderr and "usage: scripts/gpu_check.sh" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == [], "a usage error must create nothing"


def test_help():
    r, _ = _run(["--help"], timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("usage: scripts/gpu_check.sh"), r.stdout
    for flag in ("--quick", "--no-build", "--no-sanitizer", "--budget", "OUT_DIR"):
        assert flag in r.stdout


def test_without_a_gpu_it_fails_and_says_so(tmp_path):
    out = tmp_path / "relative-out"
    r, took = _run(["--no-build", "--budget", "120", "relative-out"], cwd=tmp_path)
    assert r.returncode == 1, (r.stdout[-3000:], r.stderr[-2000:])
    assert sorted(os.listdir(out)) == ["gpu_check.tar.gz", "summary.txt"], "exactly two files, for the 8-file limit"
    summary = (out / "summary.txt").read_text()
    lines = summary.splitlines()
    assert lines[0].startswith("RESULT: FAIL") and "NO GPU FOUND" in lines[0], lines[0]
    assert len(lines) <= 45, f"more than a screen: {len(lines)} lines"
    gpu_row = next(l for l in lines if " gpu " in l)
    assert "FAIL" in gpu_row and "NO GPU FOUND:" in gpu_row, gpu_row
    # The GPU tests ran and skipped, and that is a failure, not a pass.
    for step in ("gpu_tests", "gpu_checks", "gpu_ipc"):
        row = next(l for l in lines if f" {step} " in l)
        assert "FAIL" in row and "skipped" in row, row
    assert "skipped GPU tests count as failures" in summary
    assert "SKIP  sweep" in summary and "SKIP  build" in summary and "SKIP  ipc_bench" in summary
    assert "libnccl loaded:" in summary
    if ringcomm.cuda.compiled():
        assert "no GPU found (neither ringcomm nor torch sees a CUDA device)" in gpu_row
        assert "CUDA runtime (linked into ringcomm)" in summary
    else:
        assert "this ringcomm build has no GPU path" in gpu_row
    assert summary in r.stdout, "the summary is printed at the end"
    files = _archive(out)
    assert files["gpu_check/summary.txt"] == summary
    for name in ("env.txt", "machine.txt", "gpu_tests.log", "gpu_tests.xml", "gpu_checks.log", "gpu_checks.xml",
                 "gpu_ipc.log", "gpu_ipc.xml"):
        assert f"gpu_check/{name}" in files, sorted(files)
    assert "GPU_FOUND=0" in files["gpu_check/env.txt"]
    # pytest ran unbuffered and verbose, with the slowest tests listed.
    log = files["gpu_check/gpu_checks.log"]
    assert "-v -rA --durations=15" in log and "SKIPPED" in log and "slowest" in log, log[:2000]
    assert took < 120


def _hanging_python(tmp_path):
    """A stand-in for PYTHON whose pytest hangs (everything else is the real one)."""
    fake = tmp_path / "python"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        if [ "$1" = -m ] && [ "$2" = pytest ]; then echo "pytest hangs here"; exec sleep 600; fi
        exec {sys.executable} "$@"
    """))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake


def test_a_hung_step_is_cut_at_the_budget(tmp_path):
    """PYTHON's pytest hangs: with --quick and a 40 s budget the script still ends
    within the budget, says which steps timed out, and the archive holds their logs."""
    fake = _hanging_python(tmp_path)
    out = tmp_path / "out"
    r, took = _run(["--quick", "--no-build", "--budget=40", str(out)], python=str(fake), timeout=120)
    assert r.returncode == 1, (r.stdout[-3000:], r.stderr[-2000:])
    assert took < 40 + 10, f"the run took {took:.0f} s against a 40 s budget"
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("RESULT: FAIL")
    assert "--quick" in summary.splitlines()[1]
    row = next(l for l in summary.splitlines() if " gpu_tests " in l)
    assert "TIMED OUT" in row, summary
    row = next(l for l in summary.splitlines() if " gpu_checks " in l)
    assert "TIMED OUT" in row or "not run: out of time" in row, summary
    files = _archive(out)
    assert "pytest hangs here" in files["gpu_check/gpu_tests.log"]
    assert "[exit 124" in files["gpu_check/gpu_tests.log"]


def test_a_run_killed_from_outside_leaves_an_incomplete_failure(tmp_path):
    """Killed (SIGKILL, as a device time limit does) while a step runs: what is left
    in OUT_DIR says FAIL, incomplete, and which step was running; never PASS."""
    fake = _hanging_python(tmp_path)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    env["PYTHON"] = str(fake)
    p = subprocess.Popen(["bash", SCRIPT, "--no-build", "--budget", "120", str(out)], env=env, cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # Longer than the steps before gpu_tests.log may take (env.txt alone may use
        # its 60 s cap on a loaded machine), shorter than the 120 s budget.
        deadline = time.monotonic() + 100
        summary = ""
        while time.monotonic() < deadline and "gpu_tests.log" not in summary:
            time.sleep(0.2)
            summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    finally:
        os.killpg(p.pid, 9)
        p.wait(timeout=30)
    first = (out / "summary.txt").read_text().splitlines()[0]
    assert first.startswith("RESULT: FAIL (incomplete: the run stopped during gpu_tests.log"), first
    files = _archive(out)
    assert files["gpu_check/summary.txt"].splitlines()[0] == first
    assert "GPU_FOUND=0" in files["gpu_check/env.txt"]


IPC_OK = ("IPC_BENCH: OK kernels sum/float32 0.91x of copy (3800 vs 4200 GB/s) (target 0.85x); "
          "8 B all_reduce: oneshot 9.5 us (ws 2), ring 40.1 us, nccl ws1 7.2 us")
IPC_SLOW = "IPC_BENCH: FAIL kernels sum/float32 0.70x of copy (2900 vs 4200 GB/s) (target 0.85x)"


def _stand_in_gpu(tmp_path, ipc_line, ipc_rc):
    """A stand-in for PYTHON that reports a GPU, passes its one test per pytest run,
    prints a clean sweep table and `ipc_line` for scripts/ipc_bench.py."""
    table = tmp_path / "sweep.txt"
    table.write_text(SWEEP.format(wrong="0 OK", failed=""))
    fake = tmp_path / "python"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        if [ "$1" = scripts/gpu_env.py ]; then
          echo "torch devices: ['0: Stand-in GPU']"; echo "GPU_FOUND=1 1 device(s): stand-in"; exit 0
        fi
        if [ "$1" = -m ] && [ "$2" = pytest ]; then
          while [ $# -gt 0 ]; do [ "$1" = --junitxml ] && xml=$2; shift; done
          echo '<testsuites><testsuite><testcase classname="t" name="ok"/></testsuite></testsuites>' > "$xml"
          echo "1 passed"; exit 0
        fi
        if [ "$1" = -m ] && [ "$2" = ringcomm.bench.cli ]; then cat {table}; exit 0; fi
        if [ "$1" = scripts/ipc_bench.py ]; then echo "== figures"; echo "{ipc_line}"; exit {ipc_rc}; fi
        exec {sys.executable} "$@"
    """))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake


def test_the_pass_path_with_a_stand_in_gpu(tmp_path):
    """The only run that passes needs a GPU; here PYTHON is a stand-in (_stand_in_gpu):
    the script must then say PASS, exit 0, and carry the sweep's and cuda_ipc's figures."""
    fake = _stand_in_gpu(tmp_path, IPC_OK, 0)
    out = tmp_path / "out"
    env_path = ":".join(p for p in os.environ.get("PATH", "").split(":") if not os.path.exists(
        os.path.join(p, "compute-sanitizer")))
    r, _ = _run(["--no-build", "--budget", "200", str(out)], python=str(fake), path=env_path)
    summary = (out / "summary.txt").read_text()
    assert r.returncode == 0 and summary.startswith("RESULT: PASS\n"), summary
    assert "OK    gpu                1 device(s): stand-in" in summary
    for algo in ("nccl", "ring"):
        assert f"OK    sweep {algo}" in summary and "all_reduce 310.5 ringcomm  352.25 nccl" in summary
    assert "problems:" not in summary
    assert "OK    gpu_ipc" in summary
    assert "OK    ipc_bench          kernels sum/float32 0.91x of copy" in summary
    assert "oneshot 9.5 us (ws 2), ring 40.1 us, nccl ws1 7.2 us" in summary
    assert "ipc_bench.txt" in "".join(_archive(out))


def test_reduction_kernels_below_target_fail_the_check(tmp_path):
    """scripts/ipc_bench.py's verdict (kernels under 85% of the copy) reaches the summary as a failure."""
    fake = _stand_in_gpu(tmp_path, IPC_SLOW, 1)
    out = tmp_path / "out"
    env_path = ":".join(p for p in os.environ.get("PATH", "").split(":") if not os.path.exists(
        os.path.join(p, "compute-sanitizer")))
    r, _ = _run(["--no-build", "--quick", "--budget", "200", str(out)], python=str(fake), path=env_path)
    summary = (out / "summary.txt").read_text()
    assert r.returncode == 1 and summary.startswith("RESULT: FAIL (1 problem)"), summary
    assert "FAIL  ipc_bench          kernels sum/float32 0.70x of copy" in summary
    assert "ipc_bench: kernels sum/float32 0.70x" in summary  # in the problems list too


def test_ipc_bench_helpers():
    import ipc_bench

    assert ipc_bench.SIZES[0] == 8 and ipc_bench.SIZES[-1] == 256 << 10
    ok, text = ipc_bench.kernel_verdict([("sum/float32", 900.0, 1000.0), ("sum/bfloat16", 860.0, 1000.0)])
    assert ok and text.startswith("kernels sum/float32 0.90x of copy (900 vs 1000 GB/s)"), text
    ok, text = ipc_bench.kernel_verdict([("sum/float32", 800.0, 1000.0)])
    assert not ok and "0.80x" in text
    assert ipc_bench.kernel_verdict([]) == (False, "no kernel figures")
    lat = {"oneshot": {8: 5.0, 64: 6.0, 1024: 20.0, 4096: 60.0},
           "twoshot": {8: 9.0, 64: 9.0, 1024: 12.0, 4096: 30.0},
           "ring": {8: 30.0, 64: 30.0, 1024: 13.0, 4096: 25.0}}
    assert ipc_bench.suggest_thresholds(lat) == (64, 1024)
    table = ipc_bench.latency_table({**lat, "nccl_ws1": {8: 7.0}}, [8, 4096])
    assert table[0].split() == ["bytes", "nccl_ws1", "us", "oneshot", "us", "twoshot", "us", "ring", "us"]
    assert table[2].split() == ["4096", "-", "60.0", "30.0", "25.0"]


# ------------------------------------------------------------ the helpers alone

def _junit(tmp_path, cases):
    body = "".join(f'<testcase classname="tests.t" name="{n}">{inner}</testcase>' for n, inner in cases)
    p = tmp_path / "j.xml"
    p.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return str(p)


def test_report_passes_only_when_every_test_ran_and_passed(tmp_path):
    ok, lines = gpu_check_report.verdict(_junit(tmp_path, [("a", ""), ("b", "")]))
    assert ok and lines == ["2 passed, 0 failed, 0 errors, 0 skipped"]
    ok, lines = gpu_check_report.verdict(_junit(tmp_path, [("a", ""), ("b", '<skipped message="no CUDA device"/>')]))
    assert not ok and "1 skipped" in lines[0] and "count as failures" in lines[1]
    assert "skipped: tests.t::b: no CUDA device" in lines[2]
    ok, lines = gpu_check_report.verdict(_junit(tmp_path, [("a", '<failure message="assert 1 == 2"/>')]))
    assert not ok and "1 failed" in lines[0] and "failed: tests.t::a: assert 1 == 2" in lines
    ok, lines = gpu_check_report.verdict(_junit(tmp_path, [("a", '<error message="fixture broke"/>')]))
    assert not ok and "1 errors" in lines[0]
    ok, lines = gpu_check_report.verdict(_junit(tmp_path, []))
    assert not ok and "no test ran" in lines
    ok, lines = gpu_check_report.verdict(str(tmp_path / "missing.xml"))
    assert not ok and "killed" in lines[0]
    # A test that needs more GPUs than the machine has is named, and does not fail the run.
    ok, lines = gpu_check_report.verdict(_junit(tmp_path, [
        ("a", ""), ("two", '<skipped message="needs two GPUs (GPU 0 must stay untouched)"/>')]))
    assert ok and lines[0].startswith("1 passed, 0 failed, 0 errors, 0 skipped, 1 skipped as allowed"), lines
    assert "tests.t::two (needs two GPUs" in lines[0]
    ok, lines = gpu_check_report.verdict(_junit(tmp_path, [("two", '<skipped message="needs two GPUs"/>')]))
    assert not ok and "no test ran" in lines
    many = [(f"t{i}", '<skipped message="x"/>') for i in range(9)]
    ok, lines = gpu_check_report.verdict(_junit(tmp_path, many), 2)
    assert lines[-1] == "... and 7 more (see the log)"


SWEEP = """\
# all_reduce                                                    ringcomm                          nccl
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
        1024           256     float     sum      -1     9.41    0.11    0.00      0    10.02    0.10    0.00      0
# Out of bounds values : {wrong}
# Avg bus bandwidth    : 310.5 ringcomm  352.25 nccl
#
# broadcast                                                     ringcomm                          nccl
        1024           256     float    none       0     5.80    0.18    0.18      0     6.00    0.17    0.17      0
# Out of bounds values : 0 OK
{failed}# Avg bus bandwidth    : 120 ringcomm  130 nccl
"""


def test_sweep_verdict(tmp_path):
    p = tmp_path / "sweep.txt"
    p.write_text(SWEEP.format(wrong="0 OK", failed=""))
    ok, line = gpu_check_report.sweep_verdict(str(p))
    assert ok and line == "avg busbw GB/s: all_reduce 310.5 ringcomm  352.25 nccl; broadcast 120 ringcomm  130 nccl"
    p.write_text(SWEEP.format(wrong="3 FAILED", failed=""))
    ok, line = gpu_check_report.sweep_verdict(str(p))
    assert not ok and line == "wrong results: all_reduce: 3 FAILED wrong elements"
    p.write_text(SWEEP.format(wrong="0 OK", failed="# Failed calls         : 2 (tracebacks on stderr)\n"))
    ok, line = gpu_check_report.sweep_verdict(str(p))
    assert not ok and "broadcast: 2 (tracebacks on stderr) failed calls" in line
    p.write_text("# nothing measured\n")
    assert gpu_check_report.sweep_verdict(str(p)) == (False, "the sweep table has no results")
    assert not gpu_check_report.sweep_verdict(str(tmp_path / "none.txt"))[0]


def test_mapped_nccl_libraries_are_read_from_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /site/nvidia/nccl/lib/libnccl.so.2\n"
        "7f04-7f05 r--p 00001000 08:01 2 /site/nvidia/nccl/lib/libnccl.so.2\n"
        "7f06-7f07 rw-p 00000000 00:00 0 \n"
        "7f08-7f09 r-xp 00000000 08:01 3 /opt/torch/lib/libnccl.so.2.27.3\n")
    assert gpu_env.mapped_nccl_libraries(str(maps)) == [
        "/site/nvidia/nccl/lib/libnccl.so.2", "/opt/torch/lib/libnccl.so.2.27.3"]
    assert gpu_env.mapped_nccl_libraries(str(tmp_path / "none"))[0].startswith("(cannot read")
