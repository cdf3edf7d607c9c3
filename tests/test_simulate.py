"""ringcomm-bench --simulate (python/ringcomm/bench/simulate.py): the CLI for
each preset, its JSON (every row, picks = the argmin), its parameters and
their overrides, and bad options as clear errors. Pure arithmetic: nothing
here starts a rank."""

import json
import subprocess
import sys
import time

import pytest

from ringcomm import cost_model
from ringcomm.bench import cli, simulate
from ringcomm.bench.collectives import COLLECTIVES


def run_cli(tmp_path, *args, timeout=60):
    """The real command line in a fresh interpreter, with a hard timeout."""
    out = tmp_path / "out.json"
    png = tmp_path / "out.png"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ringcomm.bench.cli", "--simulate", *args,
                           "--json", str(out), "--plot", str(png)],
                          capture_output=True, text=True, timeout=timeout)
    return proc, out, png, time.monotonic() - t0


def expected_rows(doc):
    n = 0
    for topo in doc["topologies"]:
        for op in doc["ops"]:
            share = COLLECTIVES[op].per_rank_share
            n += sum(1 for s in doc["sizes"] if not share or s >= 4 * topo["world_size"])
    return n


@pytest.mark.parametrize("preset", sorted(simulate.PRESETS))
def test_each_preset_runs_and_writes_every_row(tmp_path, preset):
    proc, out, png, elapsed = run_cli(tmp_path, "--preset", preset, "--max-ranks", "64", "-e", "1M",
                                      "-f", "8", "--ops", "all")
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 30, f"--simulate took {elapsed:.1f} s for a small range"
    assert png.stat().st_size > 10_000
    doc = json.loads(out.read_text())
    assert doc["format"] == simulate.FORMAT and doc["preset"] == preset
    assert doc["command"].startswith("ringcomm-bench --simulate --preset " + preset)
    assert doc["sources"] and (doc["references"] or doc["no_reference"])
    rph = simulate.PRESETS[preset].ranks_per_host
    assert [t["world_size"] for t in doc["topologies"]] == [h * rph for h in (1, 2, 4, 8, 16, 32, 64)
                                                            if 2 <= h * rph <= 64]
    assert len(doc["rows"]) == expected_rows(doc)
    keys = {(r["op"], r["world_size"], r["size_bytes"]) for r in doc["rows"]}
    assert len(keys) == len(doc["rows"])
    for r in doc["rows"]:
        times = {n: c["time_us"] for n, c in r["algos"].items()}
        assert r["pick"] == min(times, key=times.get), r
        n = r["world_size"]
        for c in r["algos"].values():
            want = r["size_bytes"] / (c["time_us"] * 1e-6) * COLLECTIVES[r["op"]].factor(n) / 1e9
            assert c["busbw_gbps"] == pytest.approx(want, rel=1e-5)
    # The table: the command first, one marked pick per row, the reference points named.
    lines = proc.stdout.splitlines()
    assert lines[0] == "# " + doc["command"]
    body = [ln for ln in lines if ln and not ln.startswith("#")]
    assert len(body) == len(doc["rows"]) and all(ln.count("*") == 1 for ln in body)
    for ref in doc["references"]:
        assert ref["label"] in proc.stdout and "github.com/NVIDIA/nccl-tests/issues/" in ref["source"]
    if not doc["references"]:
        assert doc["no_reference"] in proc.stdout


def test_rows_match_the_model_and_the_preset_is_what_it_says(tmp_path, capsys):
    out = tmp_path / "dgx.json"
    assert cli.main(["--simulate", "--preset", "dgx-h100-ib400", "--hosts", "1,4", "-b", "1K", "-e", "64M",
                     "-f", "4", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    p = doc["params"]
    assert p["nics"] == 8 and p["inter"]["beta"] == pytest.approx(1 / 47e9)
    m = cost_model.model(4, 8, p)
    for r in (r for r in doc["rows"] if r["world_size"] == 32):
        got = m.predict(r["op"], r["size_bytes"])
        assert r["pick"] == got[0][0]
        assert {n: c["time_us"] for n, c in r["algos"].items()} == \
            pytest.approx({n: t * 1e6 for n, t in got}, rel=1e-5)
    # One NIC per GPU is what makes the hierarchical all_reduce win at 64 MiB over 4 nodes.
    big = next(r for r in doc["rows"] if r["world_size"] == 32 and r["op"] == "all_reduce"
               and r["size_bytes"] == 64 << 20)
    assert big["pick"] == "hierarchical"
    capsys.readouterr()
    assert cli.main(["--simulate", "--preset", "dgx-h100-ib400", "--hosts", "4", "-b", "64M", "-e", "64M",
                     "--nics", "1", "--json", str(out)]) == 0
    one = json.loads(out.read_text())["rows"][0]
    assert one["algos"]["hierarchical"]["time_us"] > big["algos"]["hierarchical"]["time_us"] * 3
    assert "nics 1" in capsys.readouterr().out


def test_overrides_and_parameter_files(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert cli.main(["--simulate", "--preset", "cpu-10gbe", "--hosts", "2", "-e", "1K", "--inter-gbps", "2.5",
                     "--inter-alpha-us", "20", "--intra-gbps", "10", "--intra-alpha-us", "1", "--gamma-gbps", "4",
                     "--json", str(out)]) == 0
    p = json.loads(out.read_text())["params"]
    assert p["inter"]["beta"] == pytest.approx(1 / 2.5e9) and p["inter"]["alpha"] == pytest.approx(20e-6)
    assert p["intra"]["beta"] == pytest.approx(1 / 10e9) and p["intra"]["alpha"] == pytest.approx(1e-6)
    assert p["gamma"] == pytest.approx(1 / 4e9)
    assert "given on the command line" in capsys.readouterr().out
    saved = tmp_path / "cal.json"
    given = {"intra": {"alpha": 2e-6, "beta": 1e-10, "overhead": 0.0},
             "inter": {"alpha": 30e-6, "beta": 1e-9, "overhead": 1e-6}, "gamma": 1e-10, "nics": 2}
    cost_model.save(str(saved), given)
    assert cli.main(["--simulate", "--params", str(saved), "--ranks-per-host", "2,4", "--max-ranks", "16",
                     "-e", "1K", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["params"]["inter"] == given["inter"] and doc["params"]["nics"] == 2
    assert {(t["hosts"], t["ranks_per_host"]) for t in doc["topologies"]} == \
        {(1, 2), (2, 2), (4, 2), (8, 2), (1, 4), (2, 4), (4, 4)}
    assert str(saved) in capsys.readouterr().out


BAD = [
    ([], "describe a topology"),
    (["--preset", "cpu-9gbe"], "invalid choice"),
    (["--ranks-per-host", "x"], "--ranks-per-host must be a comma list"),
    (["--ranks-per-host", "0"], "positive integers"),
    (["--preset", "cpu-10gbe", "--hosts", "2,-1"], "--hosts must list positive integers"),
    (["--preset", "cpu-10gbe", "--min-ranks", "64", "--max-ranks", "8"], "--min-ranks <= --max-ranks"),
    (["--preset", "cpu-10gbe", "--hosts", "16", "--max-ranks", "8"], "no world size"),
    (["--preset", "cpu-10gbe", "--inter-gbps", "-1"], "--inter-gbps must be a positive number"),
    (["--preset", "cpu-10gbe", "--intra-alpha-us", "nan"], "--intra-alpha-us must be a positive number"),
    (["--preset", "cpu-10gbe", "--inter-overhead-us", "-2"], "--inter-overhead-us must be >= 0"),
    (["--preset", "cpu-10gbe", "--nics", "0"], "nics must be an integer"),
    (["--preset", "cpu-10gbe", "--ops", "all_reduce,alltoall"], "--ops: unknown alltoall"),
    (["--preset", "cpu-10gbe", "-e", "12Q"], "invalid size"),
    (["--preset", "cpu-10gbe", "-f", "1"], "-f must be >= 2"),
    (["--preset", "cpu-10gbe", "--plot-ranks", "3"], "--plot-ranks [3] not among"),
    (["--preset", "cpu-10gbe", "--params", "/nonexistent/model.json"], "cannot be read"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_options_are_clear_errors(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--simulate", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "ringcomm-bench --simulate" in err, err


def test_simulate_starts_no_ranks_and_no_torch_distributed():
    code = ("import sys, io, contextlib\n"
            "from ringcomm.bench import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = cli.main(['--simulate', '--preset', 'cpu-1gbe', '--max-ranks', '16', '-e', '1K'])\n"
            "print(rc, 'torch.distributed' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "False"]
