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

HERE = Path(__file__).resolve().parent


def _listed(world_size):
    names = []
    for line in (HERE / "torch_dist_suite_ci.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, _, sizes = line.partition(" ")
        if not sizes or str(world_size) in sizes.replace(",", " ").split():
            names.append(name)
    return names


@pytest.mark.parametrize("world_size", (2, 3))
def test_torch_suite_subset_on_ringcomm(world_size, tmp_path):
    pytest.importorskip("expecttest", reason="torch's test utilities need expecttest")
    pytest.importorskip("hypothesis", reason="torch's test utilities need hypothesis")
    names = _listed(world_size)
    assert names, "the CI list is empty"
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(names) + "\n")
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
