"""Runs torch's own distributed test suite (DistributedTest) on ringcomm.

torch ships the suite that its CI runs for every backend in the wheel
(torch/testing/_internal/distributed/distributed_test.py). torch's
test/distributed/test_distributed_spawn.py drives it: it sets BACKEND,
WORLD_SIZE, INIT_METHOD and TEMP_DIR and subclasses TestDistBackend and
DistributedTest._DistTestBase, each test spawning WORLD_SIZE ranks. This file
does the same, in one of three modes (``--mode``):

``ringcomm``
    BACKEND=ringcomm, the honest name. Most of the suite gates itself on the
    backend's name (``BACKEND == "gloo"``, ``DistTestCases.backend_feature``),
    so this runs the tests open to any backend; "ringcomm" is added to the
    feature sets of what it supports (ddp, subgroup, plugin, and the CPU
    collectives), as torch's CI does for its own backends.
``gloo-standin``
    BACKEND=gloo, with torch's ProcessGroupGloo replaced (in every rank, before
    any group exists) by ringcomm's process group. Every gloo-gated test then
    runs against ringcomm: this is how "every test that passes on gloo passes
    on ringcomm" is checked.
``gloo``
    torch's real gloo, for the side-by-side counts.

    python tests/torch_dist_suite.py --mode gloo-standin --world-size 2 [-k PATTERN] [--list FILE]
        [--results FILE]

``--list FILE`` runs the tests FILE names: one per line, ``#`` comments, and a
name may be followed by the world sizes it runs at (``test_foo 2``; the format of
tests/torch_dist_suite_ci.txt, read by tests/suite_list.py). The pass/fail/skip
counts are printed at the end (``SUITE mode=... passed=...``) and, with
``--results FILE``, every test's outcome is written there as JSON.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import unittest


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["ringcomm", "gloo-standin", "gloo"], default="gloo-standin")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("-k", action="append", default=[], help="run tests whose name contains this (repeatable)")
    p.add_argument("--list", help="file with one test name per line to run (# comments; a name may be followed by "
                                  "the world sizes it runs at, e.g. 'test_foo 2')")
    p.add_argument("--results", help="write {test: outcome} as JSON here")
    p.add_argument("--timeout", type=int, default=120, help="seconds per test (torch's watchdog)")
    return p.parse_args()


def _configure(mode, world_size, timeout):
    """Environment the suite reads at import; inherited by the spawned ranks."""
    os.environ["BACKEND"] = "ringcomm" if mode == "ringcomm" else "gloo"
    os.environ["RINGCOMM_SUITE_MODE"] = mode
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("INIT_METHOD", "env://")
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="ringcomm-dist-suite-"))
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout)


if __name__ == "__main__":
    _ARGS = _parse()
    _configure(_ARGS.mode, _ARGS.world_size, _ARGS.timeout)

# Spawned ranks re-import this file as __mp_main__ with the parent's environment.
_MODE = os.environ.get("RINGCOMM_SUITE_MODE")
if _MODE is None:
    raise SystemExit("run tests/torch_dist_suite.py as a script (see its docstring)")

if _MODE == "gloo-standin":
    from torch_standin import install_as_gloo  # tests/torch_standin.py, beside this file

    install_as_gloo()
elif _MODE == "ringcomm":
    import ringcomm.torch_backend  # noqa: F401  (registers "ringcomm")

from torch.testing._internal import common_distributed  # noqa: E402

if _MODE == "ringcomm":
    for feature in ("ddp", "subgroup", "plugin"):
        common_distributed.DistTestCases.backend_feature[feature].add("ringcomm")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As torch's test_distributed_spawn.py: each test spawns WORLD_SIZE ranks."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Recorder(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes = {}
        self._start = {}

    def startTest(self, test):
        self._start[test.id()] = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = {"outcome": outcome, "seconds": round(time.monotonic() - self._start.get(test.id(), time.monotonic()), 1),
                               "detail": detail[-2000:]}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", str(reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def _selected(args):
    names = sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_"))
    wanted = None
    if args.list:
        from suite_list import read_list  # tests/suite_list.py, beside this file

        try:
            wanted = set(read_list(args.list, args.world_size))
        except ValueError as e:
            raise SystemExit(str(e))
        unknown = wanted - set(names)
        if unknown:
            raise SystemExit(f"not tests of the suite: {sorted(unknown)}")
    out = []
    for n in names:
        if wanted is not None and n not in wanted:
            continue
        if args.k and not any(k in n for k in args.k):
            continue
        out.append(n)
    return out


def main(args):
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in _selected(args))
    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=2, stream=sys.stderr)
    start = time.monotonic()
    result = runner.run(suite)
    counts = {k: 0 for k in ("passed", "failed", "skipped", "xfail")}
    for r in result.outcomes.values():
        counts[r["outcome"]] += 1
    if args.results:
        with open(args.results, "w") as f:
            json.dump({"mode": args.mode, "world_size": args.world_size, "counts": counts,
                       "tests": result.outcomes}, f, indent=1, sort_keys=True)
    print(f"SUITE mode={args.mode} world_size={args.world_size} "
          + " ".join(f"{k}={v}" for k, v in counts.items())
          + f" seconds={time.monotonic() - start:.0f}", flush=True)
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(_ARGS))
