"""Tests of the bandwidth sweep (ringcomm.bench): factors, sizes, checks, JSON, plot,
and tiny end-to-end sweeps over 2 spawned ranks (and under mpirun when it is there)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ringcomm.bench import check
from ringcomm.bench.backends import format_host_groups, same_host_groups, stale_build_lock
from ringcomm.bench.buffers import Buffer, Buffers, resolve_dtype
from ringcomm.bench.cli import _backend_instances, parse_args
from ringcomm.bench.collectives import COLLECTIVES, busbw_factor, resolve_ops
from ringcomm.bench.report import (Cell, Row, Table, build_report, machine_facts,
                                   validate_report)
from ringcomm.bench.sizes import parse_size, size_list
from ringcomm.bench.timing import (MAX_SETTLE_CALLS, Measurement, Prepared, TimingParams, _schedule, measure,
                                   measure_side_by_side, prepare)

SWEEP_TIMEOUT_S = 240
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- factors

@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_busbw_factors_follow_nccl_tests(n):
    share = (n - 1) / n
    expected = {"all_reduce": 2 * share, "reduce_scatter": share, "all_gather": share,
                "all_to_all": share, "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0,
                # nccl-tests src/scatter.cu and src/gather.cu: (n-1)/n of the total size
                "scatter": share, "gather": share}
    assert set(expected) == set(COLLECTIVES)
    for op, factor in expected.items():
        assert busbw_factor(op, n) == pytest.approx(factor), op


def test_busbw_of_eight_rank_all_reduce():
    # 1 GB in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s.
    assert COLLECTIVES["all_reduce"].busbw(100.0, 8) == pytest.approx(175.0)


def test_layouts_use_per_rank_share_and_total_size():
    f32 = 4
    ag = COLLECTIVES["all_gather"].layout(1024, f32, 4)
    assert (ag.count, ag.in_count, ag.out_count, ag.size) == (64, 64, 256, 1024)
    rs = COLLECTIVES["reduce_scatter"].layout(1024, f32, 4)
    assert (rs.count, rs.in_count, rs.out_count, rs.size) == (64, 256, 64, 1024)
    ar = COLLECTIVES["all_reduce"].layout(1024, f32, 4)
    assert (ar.count, ar.in_count, ar.out_count, ar.size) == (256, 0, 256, 1024)
    a2a = COLLECTIVES["all_to_all"].layout(1000, f32, 4)  # 250 elements -> 62 per rank
    assert (a2a.count, a2a.in_count, a2a.out_count, a2a.size) == (62, 248, 248, 992)
    assert COLLECTIVES["gather"].layout(8, f32, 4) is None  # 2 elements for 4 ranks


def test_resolve_ops_accepts_nccl_tests_names():
    assert resolve_ops("all") == list(COLLECTIVES)
    assert resolve_ops("allreduce, alltoall,all_gather") == ["all_reduce", "all_to_all",
                                                             "all_gather"]
    with pytest.raises(ValueError, match="unknown op"):
        resolve_ops("allreduce,bogus")


# --------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("text,nbytes", [
    ("8", 8), ("1K", 1024), ("64k", 65536), ("256M", 256 << 20), ("1G", 1 << 30),
    ("0.5M", 512 << 10), ("128MB", 128 << 20), ("4 K", 4096)])
def test_parse_size_suffixes(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "abc", "1T", "-8", "K"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_size_list_like_nccl_tests():
    assert size_list(8, 64, 2) == [8, 16, 32, 64]
    assert size_list(8, 100, 2) == [8, 16, 32, 64]
    assert size_list(parse_size("1K"), parse_size("1M"), 4) == [1 << k for k in range(10, 21, 2)]
    assert size_list(parse_size("1K"), parse_size("4K"), 1, parse_size("1K")) == [
        1024, 2048, 3072, 4096]
    assert size_list(parse_size("8"), parse_size("256M"), 2)[-1] == 256 << 20
    assert len(size_list(8, 256 << 20, 2)) == 26
    with pytest.raises(ValueError):
        size_list(64, 8, 2)
    with pytest.raises(ValueError):
        size_list(0, 8, 2)


def test_cli_flags_parse_like_nccl_tests():
    args = parse_args(["-b", "1K", "-e", "1M", "-f", "4", "-n", "7", "-w", "2", "-o", "max",
                       "-d", "half", "-r", "1", "-c", "0", "--ops", "allreduce,bcast",
                       "--backends", "gloo,mpi"])
    assert args.sizes == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert (args.iters, args.warmup, args.op, args.root, args.check) == (7, 2, "max", 1, 0)
    assert args.dtype.name == "float16" and args.dtype.label == "half"
    assert args.ops == ["all_reduce", "broadcast"] and args.backends == ["gloo", "mpi"]


def test_algo_given_several_times_makes_one_ringcomm_backend_each():
    args = parse_args(["--backends", "gloo,ringcomm", "--algo", "ring", "--algo",
                       "all_reduce:recursive_doubling,broadcast:tree", "--algo", "ring"])
    assert _backend_instances(args.backends, args.algo) == [
        ("gloo", None), ("ringcomm[ring]", "ring"),
        ("ringcomm[all_reduce:recursive_doubling,broadcast:tree]",
         "all_reduce:recursive_doubling,broadcast:tree")]
    # One --algo (or none) keeps the plain name.
    assert _backend_instances(["ringcomm"], ["oneshot"]) == [("ringcomm", "oneshot")]
    assert _backend_instances(["ringcomm", "mpi"], None) == [("ringcomm", None), ("mpi", None)]


def test_host_groups_from_every_ranks_transports():
    # 2 hosts x 2 ranks, interleaved: ranks 0, 2 on one host, 1, 3 on the other.
    rows = [["self", "tcp", "shm", "tcp"], ["tcp", "self", "tcp", "shm"],
            ["shm", "tcp", "self", "tcp"], ["tcp", "shm", "tcp", "self"]]
    assert same_host_groups(rows) == [[0, 2], [1, 3]]
    assert format_host_groups(same_host_groups(rows)) == "0,2 | 1,3"
    assert same_host_groups([["self", "tcp"], ["tcp", "self"]]) == [[0], [1]]
    # Rank 2 believes rank 0 is remote, rank 0 does not: the groups overlap.
    rows[2][0] = "tcp"
    assert same_host_groups(rows) == [[0, 2], [1, 3], [2]]


def test_machine_facts_tell_namespaces_apart_by_host_id(monkeypatch):
    monkeypatch.setenv("RINGCOMM_HOST_ID", "host7")
    facts = machine_facts()
    assert facts["host_id"] == "host7" and facts["hostname"]
    report = build_report(command=["x"], config={}, hosts=[facts, dict(facts, host_id="host8")],
                          backends={}, skipped={}, rows=[], ops=[])
    assert [h["host_id"] for h in report["hosts"]] == ["host7", "host8"]


def test_stale_torch_extension_lock_is_found(tmp_path, monkeypatch):
    """A build killed midway leaves torch's lock: DeepSpeed's backend then
    refuses with the file's name instead of waiting on it for ever."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert stale_build_lock("op") is None  # no directory, no lock
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir(exist_ok=True)  # (torch's helper makes the directory when it looks)
    lock.touch()
    assert stale_build_lock("op") is None  # a build under way
    old = os.stat(lock).st_mtime - 3600
    os.utime(lock, (old, old))
    assert stale_build_lock("op") == str(lock)
    assert stale_build_lock("op", max_age_s=7200) is None


@pytest.mark.parametrize("argv", [["-b", "1X"], ["-b", "1M", "-e", "1K"], ["--ops", "nope"],
                                  ["--backends", "nope"], ["-o", "avg", "-d", "int32"],
                                  ["-d", "complex"]])
def test_cli_rejects_bad_flags(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


# --------------------------------------------------------------------------- checks

def _simulate(op, inputs, outputs, n, redop, root):
    """The collective by its definition, straight from every rank's buffers."""
    def red(arrays):
        stack = np.stack(arrays).astype(np.float64)
        fn = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}.get(redop)
        return stack.sum(0) / n if redop == "avg" else fn(stack, axis=0)

    if op in ("all_reduce", "reduce"):
        total = red(outputs)
        return [total if (op == "all_reduce" or r == root) else None for r in range(n)]
    if op == "broadcast":
        return [outputs[root] for _ in range(n)]
    if op == "reduce_scatter":
        return list(np.split(red(inputs), n))
    if op == "all_gather":
        return [np.concatenate(inputs) for _ in range(n)]
    if op == "gather":
        return [np.concatenate(inputs) if r == root else None for r in range(n)]
    if op == "scatter":
        return list(np.split(inputs[root], n))
    if op == "all_to_all":
        blocks = [np.split(x, n) for x in inputs]
        return [np.concatenate([blocks[s][r] for s in range(n)]) for r in range(n)]
    if op == "sendrecv":
        return [inputs[(r - 1) % n] for r in range(n)]
    raise AssertionError(op)


@pytest.mark.parametrize("op,redop", [
    (op, redop) for op, c in COLLECTIVES.items()
    for redop in (check.REDOPS if c.reduces else ["sum"])])
def test_expected_results_match_the_definition(op, redop):
    n, root, dtype = 3, 1, np.float32
    coll = COLLECTIVES[op]
    layout = coll.layout(3 * 4 * 700, 4, n)  # 700 elements per rank: crosses the period
    plans = [check.plan(coll, layout, r, n, redop, root, dtype) for r in range(n)]
    outputs = [p.output for p in plans]
    inputs = [p.input for p in plans]
    truth = _simulate(op, inputs, outputs, n, redop, root)
    untouched = 0
    for r, p in enumerate(plans):
        if p.expected is None:
            assert truth[r] is None
            continue
        assert check.count_wrong(p.expected, truth[r].astype(dtype),
                                 check.tolerance(redop, "float32")) == 0, (op, redop, r)
        untouched += check.count_wrong(p.output, p.expected)
    assert untouched > 0, "a call that does nothing would pass the check"


def test_wrong_elements_are_counted():
    coll = COLLECTIVES["all_reduce"]
    layout = coll.layout(4096, 4, 2)
    expected = check.plan(coll, layout, 0, 2, "sum", 0, np.float32).expected
    got = expected.copy()
    assert check.count_wrong(got, expected) == 0
    got[[0, 17, 1000]] += 1
    assert check.count_wrong(got, expected) == 3
    got[5] = np.nan
    assert check.count_wrong(got, expected) == 4
    with pytest.raises(ValueError, match="elements"):
        check.count_wrong(got[:-1], expected)


def test_misplaced_blocks_are_counted():
    coll = COLLECTIVES["all_gather"]
    n = 4
    layout = coll.layout(4 * 4 * 1024, 4, n)  # power-of-two blocks
    expected = check.plan(coll, layout, 0, n, "sum", 0, np.float32).expected
    blocks = np.split(expected, n)
    swapped = np.concatenate([blocks[1], blocks[0], *blocks[2:]])
    assert check.count_wrong(swapped, expected) > layout.count  # most of 2 blocks


def test_avg_is_compared_with_a_tolerance():
    exp = np.array([7 / 3, 2.5], dtype=np.float32)
    got = exp * (1 + 1e-7)
    assert check.count_wrong(got, exp, check.tolerance("avg", "float32")) == 0
    assert check.count_wrong(got * 1.01, exp, check.tolerance("avg", "float32")) == 2
    assert check.tolerance("sum", "float16") == 0.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "uint8", "int64", "float64"])
@pytest.mark.parametrize("redop", ["sum", "prod", "max"])
def test_reductions_are_exact_in_every_type(dtype, redop):
    d = resolve_dtype(dtype)
    n = 6  # prod of values 1..2 stays <= 64, sums <= 24: exact even in int8 and bfloat16
    coll = COLLECTIVES["all_reduce"]
    layout = coll.layout(d.itemsize * 2000, d.itemsize, n)
    expected = check.plan(coll, layout, 0, n, redop, 0, np.dtype(d.check)).expected
    buf = Buffer(layout.out_count, d)
    buf.fill(expected)
    assert check.count_wrong(buf.read(), expected) == 0


def test_buffers_are_page_aligned_and_share_memory():
    buf = Buffer(1000, resolve_dtype("float32"))
    assert buf.bytes.ctypes.data % 4096 == 0
    assert buf.tensor.data_ptr() == buf.array.ctypes.data == buf.bytes.ctypes.data
    buf.fill(np.arange(1000, dtype=np.float32))
    assert float(buf.tensor[999]) == 999.0


class _FakeControl:
    rank, world_size = 0, 1

    def barrier(self):
        pass

    def gather_all(self, values):
        return np.asarray(values, dtype=np.float64).reshape(1, -1)

    def gather_objects(self, obj):
        return [obj]


class _BrokenBackend:
    """Writes the right answer except for a few elements."""

    name = "broken"

    def __init__(self, coll, layout, bad):
        self.coll, self.layout, self.bad = coll, layout, bad

    def bind(self, coll, bufs, redop, root):
        exp = check.plan(coll, self.layout, 0, 1, redop, root, np.float32).expected.copy()
        exp[:self.bad] += 1

        def run():
            np.copyto(bufs.output.array, exp)
        return run

    def barrier(self):
        pass

    def synchronize(self):
        pass


def test_measure_reports_a_deliberately_wrong_result(capsys):
    coll = COLLECTIVES["all_gather"]
    layout = coll.layout(4096, 4, 1)
    dtype = resolve_dtype("float32")
    bufs = Buffers(Buffer(layout.in_count, dtype), Buffer(layout.out_count, dtype))
    backend = _BrokenBackend(coll, layout, bad=7)
    m = measure(_FakeControl(), backend, lambda: backend.bind(coll, bufs, "sum", -1), coll,
                layout, bufs, "sum", -1, dtype, TimingParams(iters=3, min_iters=1, budget_s=0.01),
                on_error=print)
    assert m.error is None and m.wrong == 7 and len(m.samples_s) >= 1
    row = Row("all_gather", layout.size, layout.count, "float", "none", -1, 0.0,
              cells={"broken": Cell(measurement=m)})
    table = Table(sys.stdout, "all_gather", ["broken"], memcpy=False)
    table.header({})
    table.row(row)
    table.footer()
    out = capsys.readouterr().out
    assert "Out of bounds values : 7 FAILED" in out
    row_line = next(line for line in out.splitlines() if line.startswith(" "))
    assert row_line.split()[-1] == "7"  # the #wrong column


@pytest.mark.parametrize("explores, settles", [(0, 0), (4, 4), (1000, MAX_SETTLE_CALLS)])
def test_warm_up_waits_for_a_tuning_backend_to_settle(explores, settles):
    """A backend still trying candidates after the warm-up (ringcomm's tuner) runs on
    until it says it has settled, at most MAX_SETTLE_CALLS calls, before the samples."""
    coll = COLLECTIVES["all_reduce"]
    layout = coll.layout(4096, 4, 1)
    dtype = resolve_dtype("float32")
    bufs = Buffers(Buffer(layout.in_count, dtype), Buffer(layout.out_count, dtype))
    calls = []

    class Tuning(_BrokenBackend):
        def exploring(self):
            return len(calls) - warm < explores

    backend = Tuning(coll, layout, bad=0)
    p = TimingParams(iters=3, min_iters=1, budget_s=10.0, warmup=5, check=False)

    def make_run():
        inner = backend.bind(coll, bufs, "sum", -1)

        def run():
            calls.append(1)
            inner()
        return run

    warm = 5  # the checked call, the timed one, 3 more
    prep = prepare(_FakeControl(), backend, make_run, coll, layout, bufs, "sum", -1, dtype, p, on_error=print)
    assert prep.error is None
    assert len(calls) == warm + settles
    assert prep.warmup == warm + settles


def test_side_by_side_takes_samples_in_turns():
    """Backends prepared at one size sample in turns, who goes first rotating each
    round, so drift hits them alike; one whose call failed is left out, the others
    keep their own batch and sample counts."""
    log = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def barrier(self):
            log.append(self.name)

        def synchronize(self):
            pass

    a, b, c = Recorder("a"), Recorder("b"), Recorder("c")
    calls = {"a": 0, "b": 0}

    def counting(name):
        def run():
            calls[name] += 1
        return run

    prepared = [Prepared(backend=a, run=counting("a"), batch=2, samples=3, warmup=2, wrong=0),
                Prepared(backend=c, error="ValueError: refused"),
                Prepared(backend=b, run=counting("b"), batch=5, samples=2, warmup=3, wrong=0)]
    ms = measure_side_by_side(_FakeControl(), prepared)
    # Round 0 starts with a, round 1 with b, round 2 has only a left.
    assert log == ["a", "b", "b", "a", "a"]
    assert calls == {"a": 2 * 3, "b": 5 * 2}
    assert [len(m.samples_s) for m in ms] == [3, 0, 2]
    assert ms[1].error == "ValueError: refused" and ms[0].error is None and ms[2].error is None
    assert (ms[0].batch, ms[0].warmup, ms[2].batch, ms[2].wrong) == (2, 2, 5, 0)
    assert all(t >= 0 for m in ms for t in m.samples_s)


def test_side_by_side_backends_share_one_batch():
    """The same batch for every backend of a size (within each one's budget): a
    slow warm-up estimate no longer leaves one backend with a third of the
    others' batch, which measured the same schedule a third slower."""
    from ringcomm.bench.timing import _common_batch

    p = TimingParams(iters=20, min_iters=5, budget_s=0.4, batch_s=0.005)
    fast = Prepared(batch=6, samples=20, per_call=0.8e-3, params=p)
    slow_estimate = Prepared(batch=2, samples=20, per_call=2.5e-3, params=p)
    gloo = Prepared(batch=1, samples=5, per_call=13e-3, params=p)
    _common_batch([fast, slow_estimate, gloo])
    assert (fast.batch, slow_estimate.batch) == (6, 6)
    # Capped so that min_iters samples fit the budget: 0.4 / (5 * 13 ms) = 6.
    assert gloo.batch == 6 and gloo.samples == 5
    assert slow_estimate.samples == int(min(20, max(5, 0.4 // (6 * 2.5e-3))))
    huge = Prepared(batch=1, samples=5, per_call=1.0, params=p)
    _common_batch([fast, huge])
    assert huge.batch == 1 and huge.samples == 5


def test_schedule_batches_small_calls_and_cuts_large_ones():
    p = TimingParams(iters=20, min_iters=5, budget_s=0.4, batch_s=0.005)
    assert _schedule(2e-6, p) == (2500, 20)     # tiny calls: batched, every sample
    assert _schedule(0.05, p) == (1, 8)         # 50 ms: budget cuts the samples
    assert _schedule(2.0, p) == (1, 5)          # never fewer than min_iters


# --------------------------------------------------------------------------- report, plot

def _fake_report():
    rows = []
    for op in ("all_reduce", "all_gather"):
        for k, size in enumerate([1024, 65536, 1 << 20]):
            m = Measurement(samples_s=[1e-5 * (k + 1), 1.2e-5 * (k + 1)], batch=10, warmup=2,
                            wrong=0)
            rows.append(Row(op, size, size // 4, "float", "sum", -1, 1.0,
                            cells={"ringcomm": Cell(measurement=m), "gloo": Cell(measurement=m),
                                   "mpi": Cell(skipped="not under mpirun")},
                            memcpy=Measurement(samples_s=[1e-6], batch=100)))
    config = dict(world_size=2, launcher="spawn", ops=["all_reduce", "all_gather"],
                  backends=["ringcomm", "gloo", "mpi"], dtype="float32", redop="sum", root=0,
                  minbytes=1024, maxbytes=1 << 20, stepfactor=64, iters=20, warmup=5,
                  check=True, timing="median")
    return build_report(command=["ringcomm-bench"], config=config,
                        hosts=[machine_facts()], backends={"ringcomm": {}, "gloo": {}},
                        skipped={"mpi": "not under mpirun"}, rows=rows,
                        ops=["all_reduce", "all_gather"])


def test_report_schema_of_a_built_report():
    report = _fake_report()
    assert validate_report(report) == []
    json.dumps(report, allow_nan=False)
    assert report["machine"]["cpu_cores"] >= 1
    del report["results"][0]["backends"]["gloo"]["busbw_gbps"]
    assert validate_report(report) == ["results[0].backends.gloo: missing 'busbw_gbps'"]


def test_plot_file_written(tmp_path):
    pytest.importorskip("matplotlib")
    from ringcomm.bench.plot import plot_report

    path = tmp_path / "sweep.png"
    plot_report(_fake_report(), str(path))
    assert path.read_bytes()[:8] == PNG_MAGIC


# --------------------------------------------------------------------------- end to end

def _run(cmd, tmp_path, timeout=SWEEP_TIMEOUT_S):
    env = dict(os.environ)
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=tmp_path)


def _check_sweep(proc, json_path, ops, backends):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(json_path.read_text())
    assert validate_report(report) == []
    assert report["wrong_total"] == 0
    assert report["config"]["world_size"] == 2
    assert [op for op in report["summary"]] == ops
    for op in ops:
        rows = [r for r in report["results"] if r["op"] == op]
        assert rows, op
        for r in rows:
            for b in backends:
                cell = r["backends"][b]
                assert cell["wrong"] == 0 and cell["time_us"] > 0, (op, b, cell)
            assert r["memcpy"]["gbps"] > 0
    for op in ops:
        assert f"# {op}" in proc.stdout
    assert proc.stdout.count("Avg bus bandwidth") == len(ops) * len(backends)
    assert "\r" not in proc.stderr  # no progress bar when stderr is not a terminal
    return report


@pytest.mark.slow
def test_tiny_sweep_over_two_ranks(tmp_path):
    """All primitives, 2 spawned ranks, ringcomm and gloo; mpi asked for but skipped."""
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    proc = _run([sys.executable, "-m", "ringcomm.bench.cli", "--nproc", "2",
                 "-b", "8", "-e", "64K", "-f", "32", "--ops", "all", "-n", "3", "-w", "2",
                 "--budget", "0.02", "--batch-ms", "0.5", "--timeout", "60",
                 "--backends", "ringcomm,gloo,mpi", "--json", str(out_json),
                 "--plot", str(out_png)], tmp_path)
    report = _check_sweep(proc, out_json, list(COLLECTIVES), ["ringcomm", "gloo"])
    assert "skipping mpi" in proc.stderr and "mpi" in report["skipped_backends"]
    assert report["machine"]["ringcomm"] and report["machine"]["torch"]
    assert report["command"][:3] == ["python", "-m", "ringcomm.bench.cli"]
    assert "--nproc" in report["command"]
    assert out_png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_entry_script_runs_the_same_sweep(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sweep.py")
    out_json = tmp_path / "r.json"
    proc = _run([sys.executable, script, "-b", "1K", "-e", "1K", "--ops", "allreduce",
                 "-d", "bfloat16", "-o", "max", "-n", "2", "--budget", "0.01",
                 "--batch-ms", "0.2", "--timeout", "60", "--json", str(out_json)], tmp_path)
    report = _check_sweep(proc, out_json, ["all_reduce"], ["ringcomm", "gloo"])
    assert report["results"][0]["type"] == "bfloat16" and report["results"][0]["count"] == 512


@pytest.mark.slow
def test_several_ringcomm_algorithms_in_one_sweep(tmp_path):
    out_json = tmp_path / "r.json"
    proc = _run([sys.executable, "-m", "ringcomm.bench.cli", "-b", "8", "-e", "64K", "-f", "8192",
                 "--ops", "all_reduce,broadcast", "-n", "2", "--budget", "0.01",
                 "--batch-ms", "0.2", "--timeout", "60", "--backends", "ringcomm,gloo",
                 "--algo", "ring", "--algo", "all_reduce:oneshot,broadcast:tree",
                 "--no-memcpy", "--json", str(out_json)], tmp_path)
    names = ["ringcomm[ring]", "ringcomm[all_reduce:oneshot,broadcast:tree]", "gloo"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out_json.read_text())
    assert validate_report(report) == [] and list(report["backends"]) == names
    for name, algo in zip(names[:2], ["ring", "all_reduce:oneshot,broadcast:tree"]):
        assert report["backends"][name]["algo"] == algo
        assert report["backends"][name]["hosts"] == "0,1"  # one host: shared memory
    assert len(report["results"]) == 4 and report["wrong_total"] == 0
    for row in report["results"]:
        assert all(row["backends"][b]["wrong"] == 0 for b in names), row
    assert report["config"]["hosts"] == 1 and len(report["config"]["rank_hosts"]) == 2


@pytest.mark.slow
def test_socket_reference_over_tcp(tmp_path):
    """--socket: a plain TCP exchange between ranks 0 and 1 in the same run, beside
    ringcomm over its TCP transport; and the memcpy references."""
    out_json = tmp_path / "r.json"
    proc = _run([sys.executable, "-m", "ringcomm.bench.cli", "--nproc", "2", "--transport", "tcp",
                 "-b", "8", "-e", "1M", "-f", "128", "--ops", "sendrecv,all_reduce", "-n", "3", "-w", "2",
                 "--budget", "0.02", "--batch-ms", "0.5", "--timeout", "60", "--socket",
                 "--backends", "ringcomm", "--json", str(out_json)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out_json.read_text())
    assert validate_report(report) == [] and report["wrong_total"] == 0
    assert "#  socket: ranks 0 and 1" in proc.stdout
    assert any(line.startswith("# sendrecv") and line.rstrip().endswith("socket") for line in proc.stdout.splitlines())
    for row in report["results"]:
        for ref in ("socket", "memcpy", "memcpy_all"):
            assert row[ref] and row[ref]["gbps"] > 0 and row[ref]["time_us"] > 0, (row["op"], ref, row[ref])
        assert row["backends"]["ringcomm"]["wrong"] == 0


def _mpi_launcher():
    """This environment's MPI launcher and its flags: MPICH's mpiexec from the
    [test] extra's wheel (beside this Python), else a system mpirun (Open MPI's
    needs root and oversubscription allowed). None when there is neither."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return [here]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return None
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        return [mpirun, "--allow-run-as-root", "--oversubscribe"]
    return [mpirun]


@pytest.mark.slow
@pytest.mark.skipif(_mpi_launcher() is None, reason="no MPI launcher")
def test_tiny_sweep_under_mpirun(tmp_path):
    """Every primitive under an MPI launcher, ringcomm next to gloo and the MPI;
    DeepSpeed's shared-memory all_reduce too where DeepSpeed is installed."""
    pytest.importorskip("mpi4py")
    deepspeed = importlib.util.find_spec("deepspeed") is not None
    backends = ["ringcomm", "gloo", "mpi"] + (["deepspeed"] if deepspeed else [])
    out_json = tmp_path / "r.json"
    proc = _run(_mpi_launcher() + ["-n", "2", sys.executable, "-m", "ringcomm.bench.cli",
                                   "-b", "8", "-e", "64K", "-f", "64", "--ops", "all", "-n", "3", "-w", "2",
                                   "--budget", "0.02", "--batch-ms", "0.5", "--timeout", "60",
                                   "--backends", ",".join(backends), "--json", str(out_json)],
                tmp_path, timeout=SWEEP_TIMEOUT_S + 240)  # DeepSpeed builds its op on first use
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out_json.read_text())
    assert validate_report(report) == [] and report["wrong_total"] == 0, proc.stdout
    assert report["config"]["launcher"] == "mpirun"
    assert report["machine"]["mpi_library"]
    assert not report["skipped_backends"], report["skipped_backends"]
    for row in report["results"]:
        for b in ["ringcomm", "gloo", "mpi"]:
            cell = row["backends"][b]
            assert cell["wrong"] == 0 and cell["time_us"] > 0, (row["op"], b, cell)
        if deepspeed:
            cell = row["backends"]["deepspeed"]
            if row["op"] == "all_reduce":
                assert cell["wrong"] == 0 and cell["time_us"] > 0, cell
            else:
                assert "all_reduce" in cell["skipped"], cell


@pytest.mark.slow
def test_explain_and_calibrate(tmp_path):
    """--explain prints and records, per size, what ringcomm runs with its prediction
    and the other candidates; --calibrate writes a file RINGCOMM_COST_MODEL reads."""
    from ringcomm import cost_model

    out_json = tmp_path / "r.json"
    proc = _run([sys.executable, "-m", "ringcomm.bench.cli", "--nproc", "2", "-b", "8", "-e", "1M", "-f", "64",
                 "--ops", "all_reduce,broadcast", "-n", "2", "-w", "1", "--budget", "0.02", "--batch-ms", "0.5",
                 "--backends", "ringcomm", "--explain", "--no-memcpy", "--json", str(out_json)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ringcomm runs") == 2
    report = json.loads(out_json.read_text())
    for row in report["results"]:
        ex = row["explain"]
        names = [n for n, _ in ex]
        assert len(ex) >= 2 and len(set(names)) == len(names), ex
        assert ex[0][1] == min(t for _, t in ex), ex  # auto: the pick is the fastest predicted
        assert f"{ex[0][0]:>18}" in proc.stdout
    model = tmp_path / "model.json"
    proc = _run([sys.executable, "-m", "ringcomm.bench.cli", "--nproc", "2", "--calibrate", str(model),
                 "--calibrate-runs", "3"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "written to" in proc.stdout and "intra: alpha" in proc.stdout
    params = cost_model.load(str(model))
    assert params["intra"]["alpha"] > 0 and params["gamma"] > 0
    doc = json.loads(model.read_text())
    assert doc["runs"] == 3 and doc["measured_links"] == ["intra"] and doc["world_size"] == 2
    # Every candidate family was timed at every fit size and its ratio kept.
    from ringcomm.bench.fit import FIT_SIZES

    fit = params["fit"]
    assert params["fit_for"] == [2, 1]
    assert {"all_reduce:ring", "all_reduce:recursive_doubling", "broadcast:tree", "all_gather:ring"} <= set(fit)
    for name, pts in fit.items():
        assert [x for x, _ in pts] == sorted(x for x, _ in pts) and len(pts) <= len(FIT_SIZES), (name, pts)
    assert len(fit["all_reduce:ring"]) == len(FIT_SIZES)
    # Only what the model predicts has a fit: the pulls that large calls list have no formula.
    assert not [name for name in fit if name.endswith(":pull")], sorted(fit)
    assert "measured / formula per family" in proc.stdout
    proc = _run([sys.executable, "-m", "ringcomm.bench.cli", "--nproc", "2", "--calibrate", str(model),
                 "--calibrate-runs", "1", "--calibrate-no-fit"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fit" not in cost_model.load(str(model))


def test_steady_state_script_runs_settings_in_turn(tmp_path):
    """benchmarks/steady_state.py: each setting gets its launches, in turn, with a median and the tuner's pick."""
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        pytest.skip("needs taskset and two cores")
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "steady_state.py")
    proc = subprocess.run([sys.executable, script, "--launches", "1", "--iters", "4", "--mb", "1", "--op",
                           "all_gather", "--setting", "nopull=RINGCOMM_PULL=0", "--setting", "default="],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("launch 1")]
    assert [line.split()[2] for line in lines] == ["nopull:", "default:"], proc.stdout
    assert all(float(line.split()[3]) > 0 and "runs" in line for line in lines), proc.stdout
    assert "#     nopull: median over launches" in proc.stdout
    # A size in KiB, slot stores as the settings.
    proc = subprocess.run([sys.executable, script, "--launches", "1", "--iters", "4", "--kb", "64", "--op",
                           "all_gather", "--setting", "cached=RINGCOMM_SLOT_STORES=cached", "--setting",
                           "streamed=RINGCOMM_SLOT_STORES=streamed"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all_gather 64 KiB" in proc.stdout, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith("launch 1")]
    assert [line.split()[2] for line in lines] == ["cached:", "streamed:"], proc.stdout
    assert all(0 < float(line.split()[3]) < 1000 for line in lines), proc.stdout


def test_launch_modes_script_runs_builds_in_turn(tmp_path):
    """benchmarks/launch_modes.py: each build (here two settings of one) gets its launch, in turn,
    with one figure per size and phase, and a wrong result would fail the run."""
    import ringcomm

    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "launch_modes.py")
    # The ringcomm these tests import (the source tree's, or the one installed: CI's).
    python = os.path.dirname(os.path.dirname(os.path.abspath(ringcomm.__file__)))
    proc = subprocess.run([sys.executable, script, "--launches", "1", "--phases", "1",
                           "--build", f"cached={python}:RINGCOMM_SLOT_STORES=cached",
                           "--build", f"streamed={python}:RINGCOMM_SLOT_STORES=streamed"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("launch 1")]
    assert [line.split()[2] for line in lines] == ["cached:", "streamed:"], proc.stdout
    for line in lines:
        figures = [float(v) for v in line.split(":", 1)[1].split("/")]
        assert len(figures) == 3 and all(v > 0 for v in figures), line


def _load_script(name):
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tcp_vs_socket_reads_bench_and_multihost_reports(tmp_path, capsys):
    """benchmarks/tcp_vs_socket.py: a ringcomm-bench --socket report and multihost.py's OUT.json (found by
    its schema, with or without --multihost) give the same ratios; --multihost on a plain report is refused."""
    tcp_vs_socket = _load_script("tcp_vs_socket")

    def report(ring_us, sock_us):
        big = 64 << 20
        return {"backends": ["ringcomm[auto]", "gloo"], "machine": {"cpu_model": "Test CPU"},
                "results": [{"op": "sendrecv", "size_bytes": big,
                             "socket": {"time_us": sock_us, "gbps": big / sock_us / 1e3},
                             "backends": {"ringcomm[auto]": {"time_us": ring_us, "busbw_gbps": big / ring_us / 1e3},
                                          "gloo": {"time_us": 2 * ring_us}}}]}

    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(report(50000.0, 40000.0)))
    multi = tmp_path / "multi.json"
    multi.write_text(json.dumps({"schema": "ringcomm-multihost/1",
                                 "runs": [{"report": report(50000.0, 40000.0)},
                                          {"report": report(40000.0, 40000.0)},
                                          {"report": report(60000.0, 40000.0)}]}))
    outputs = []
    for argv in ([str(plain)], [str(multi)], ["--multihost", str(multi)]):
        assert tcp_vs_socket.main(argv) == 0
        row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sendrecv")]
        assert len(row) == 1
        outputs.append(row[0].split())
    assert float(outputs[0][7]) == pytest.approx(0.8)  # socket 40 ms / ringcomm 50 ms
    assert outputs[1] == outputs[2] and float(outputs[1][7]) == pytest.approx(0.8)  # the median run
    assert float(outputs[1][8]) == pytest.approx(2.0)  # gloo's time / ringcomm's
    with pytest.raises(SystemExit, match="not a multihost.py report"):
        tcp_vs_socket.main(["--multihost", str(plain)])


def test_latency_instructions_case_sizes():
    """benchmarks/latency_instructions.py: all_reduce cases name their size (ar4, ar1k, ar64k, ar1m)."""
    li = _load_script("latency_instructions")
    assert [li._ar_bytes(c) for c in ("ar4", "ar1k", "ar64k", "ar1m")] == [4, 1024, 65536, 1 << 20]
    for bad in ("ar", "ar4g", "arx", "bc8"):
        with pytest.raises(SystemExit, match="unknown case"):
            li._ar_bytes(bad)
