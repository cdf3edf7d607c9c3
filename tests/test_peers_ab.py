"""benchmarks/peers/ab_peers.py: the build argument and the summary of its reports
(built here from hand-made reports; the jobs themselves need an MPI, which CI does not
install)."""
import argparse
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("ab_peers", os.path.join(HERE, "..", "benchmarks", "peers", "ab_peers.py"))
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)


def _report(path, mpi_library, rows):
    rep = {"date": "2026-12-06T00:00:00+00:00", "machine": {"cpu_model": "Test CPU", "mpi_library": mpi_library},
           "config": {"world_size": 4, "dtype": "float32"},
           "results": [{"op": op, "size_bytes": size, "type": "float",
                        "backends": {"ringcomm": {"time_us": ring, "wrong": 0},
                                     "mpi": {"time_us": peer, "wrong": wrong}}}
                       for op, size, ring, peer, wrong in rows]}
    with open(path, "w") as f:
        json.dump(rep, f)
    return path


def test_build_argument():
    name, path, env = ab.parse_build("after=python:RINGCOMM_CHECK_AGREEMENT=0:X=1")
    assert (name, os.path.basename(path), env) == ("after", "python", {"RINGCOMM_CHECK_AGREEMENT": "0", "X": "1"})
    for bad in ("after", "=python", "after=", "after=python:NOEQUALS"):
        with pytest.raises(argparse.ArgumentTypeError):
            ab.parse_build(bad)


def test_summary_ratios(tmp_path):
    reports = [
        # before: 30 us against Open MPI's 2 (15x) and MPICH's 3 (10x), two launches for Open MPI.
        ("before", _report(tmp_path / "b1.json", "Open MPI v5", [("broadcast", 4, 30.0, 2.0, 0)])),
        ("before", _report(tmp_path / "b2.json", "Open MPI v5", [("broadcast", 4, 34.0, 2.0, 0)])),
        ("before", _report(tmp_path / "b3.json", "MPICH Version: 5", [("broadcast", 4, 30.0, 3.0, 0)])),
        # after: 16 us against Open MPI's 2 (8x); a wrong MPI result is left out.
        ("after", _report(tmp_path / "a1.json", "Open MPI v5", [("broadcast", 4, 16.0, 2.0, 0),
                                                                 ("reduce", 4, 5.0, 1.0, 3)])),
    ]
    text = ab.summarize(["before", "after"], reports, "note")
    row = next(line for line in text.splitlines() if line.strip().startswith("4 ") and "openmpi" in line)
    cells = row.split()
    # size, before us, vs MPI (best MPI: Open MPI, median of 15 and 17), after us, vs MPI, after/before, best MPI
    assert cells[:6] == ["4", "30.00", "16.00", "16.00", "8.00", "0.53"], row
    assert "## reduce" not in text
    assert "# note" in text


def test_peers_markdown_tables(tmp_path):
    """summarize.py --markdown: each cell is ringcomm's time over the fastest peer's, paired within a job
    (median over jobs), a ratio above 1 is bold, and the all_reduce table lists every backend's time."""
    spec = importlib.util.spec_from_file_location(
        "summarize", os.path.join(HERE, "..", "benchmarks", "peers", "summarize.py"))
    summ = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summ)
    paths = [
        # all_reduce 4 B: Open MPI 2.0 us in both jobs, ringcomm 3.0 and 5.0 in them: ratio 1.5 and 2.5, median 2.0.
        _report(tmp_path / "o1.json", "Open MPI v5", [("all_reduce", 4, 3.0, 2.0, 0), ("all_reduce", 1024, 1.0, 4.0, 0)]),
        _report(tmp_path / "o2.json", "Open MPI v5", [("all_reduce", 4, 5.0, 2.0, 0), ("all_reduce", 1024, 1.0, 4.0, 0)]),
        # MPICH is slower at 4 B (it is not the best peer) and gives a wrong result at 1 KiB (left out).
        _report(tmp_path / "m1.json", "MPICH Version: 5", [("all_reduce", 4, 4.0, 9.0, 0), ("all_reduce", 1024, 1.0, 0.5, 1)]),
    ]
    out = tmp_path / "table.md"
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert summ.main([str(p) for p in paths] + ["--markdown", "4,1K,64K"]) == 0
    text = buf.getvalue()
    out.write_text(text)
    assert "Test CPU; 3 jobs" in text
    row = next(line for line in text.splitlines() if line.startswith("| all_reduce | 4 | fp32 |"))
    assert row == "| all_reduce | 4 | fp32 | **2.00** OMPI | 0.25 OMPI | - |", row
    assert "| 4 B | 4.00 | 9.00 | 2.00 |" in text  # ringcomm in Open MPI's jobs; MPICH; Open MPI
    assert "| 1 KiB | 1.00 | - | 4.00 |" in text
    with pytest.raises(SystemExit):
        summ.main([str(paths[0]), "--markdown", "4,x"])
