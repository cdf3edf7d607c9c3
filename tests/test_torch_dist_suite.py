"""A CI-sized subset of torch's own DistributedTest suite, run on ringcomm.

tests/torch_dist_suite.py drives the suite as torch's test_distributed_spawn.py
does; here it runs in "gloo-standin" mode (every group torch creates for the
name "gloo" is a ringcomm group, so the gloo-gated tests run against ringcomm)
on the tests listed in torch_dist_suite_ci.txt, each of which passes on torch's
gloo on this kind of machine. Every one must pass: a skip counts as a failure
here, since none of them skips on gloo. The full run, and the counts next to
gloo's, is `python tests/torch_dist_suite.py --mode ... --world-size N`.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite_list import read_list

HERE = Path(__file__).resolve().parent


def _listed(world_size):
    return read_list(HERE / "torch_dist_suite_ci.txt", world_size)


@pytest.mark.parametrize("world_size", (2, 3))
def test_torch_suite_subset_on_ringcomm(world_size, tmp_path):
    pytest.importorskip("expecttest", reason="torch's test utilities need expecttest")
    pytest.importorskip("hypothesis", reason="torch's test utilities need hypothesis")
    names = _listed(world_size)
    assert names, "the CI list is empty"
    listing = HERE / "torch_dist_suite_ci.txt"  # as it stands: the driver reads its world sizes
    results = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    # faulthandler: a rank that crashes (SIGABRT, SIGSEGV) prints every thread's Python
    # stack into the suite's stderr, which a failure below quotes.
    env.update(TEMP_DIR=str(tmp_path), PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, str(HERE / "torch_dist_suite.py"), "--mode", "gloo-standin",
           "--world-size", str(world_size), "--list", str(listing), "--results", str(results),
           "--timeout", "120"]
    try:
        proc = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=240 + 60 * len(names))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the suite run did not finish: {(e.stderr or b'')[-3000:]!r}")
    if not results.exists():
        pytest.fail(f"the suite run wrote no results (exit {proc.returncode}):\n{proc.stderr[-5000:]}")
    got = json.loads(results.read_text())["tests"]
    missing = sorted(set(names) - set(got))
    bad = {n: r for n, r in got.items() if r["outcome"] != "passed"}
    report = "\n".join(f"{n}: {r['outcome']}: {r['detail'][-1500:]}" for n, r in sorted(bad.items()))
    if missing or bad:
        # What a crashed rank said (std::terminate's what(), faulthandler's stacks, ...).
        marks = ("terminate called", "what():", "Fatal Python error", "Aborted", "Segmentation fault",
                 "Current thread", "Thread 0x", "File \"")
        said = [line for line in proc.stderr.splitlines() if any(m in line for m in marks)]
        report += "\n--- crash lines of the suite's stderr:\n" + "\n".join(said[-80:])
        report += "\n--- end of its stderr:\n" + proc.stderr[-4000:]
    assert not missing and not bad, f"missing {missing}\n{report}"


def test_the_list_format(tmp_path):
    """read_list (the driver's --list): names alone run at every size, "NAME 2" or
    "NAME 2,3" only at those, comments and blanks skipped, a bad size named."""
    f = tmp_path / "l.txt"
    f.write_text("# c\ntest_a\n\ntest_b 2   # two only\ntest_c 2,3\ntest_d 3 4\n")
    assert read_list(f, 2) == ["test_a", "test_b", "test_c"]
    assert read_list(f, 3) == ["test_a", "test_c", "test_d"]
    assert read_list(f, 4) == ["test_a", "test_d"]
    f.write_text("test_a two\n")
    with pytest.raises(ValueError, match="l.txt:1: world sizes must be positive integers"):
        read_list(f, 2)
    # The CI list has both forms, and the driver accepts it as it stands.
    assert read_list(HERE / "torch_dist_suite_ci.txt", 2) != read_list(HERE / "torch_dist_suite_ci.txt", 3)
