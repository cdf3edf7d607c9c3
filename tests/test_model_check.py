"""benchmarks/model_check.py: prediction errors and auto's pick from multihost.py JSON
(a synthetic run whose figures are known)."""

import importlib.util
import io
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("model_check", os.path.join(HERE, "..", "benchmarks", "model_check.py"))
mc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mc)


def _run(tmp_path, name, backends, explain):
    doc = {"rate": "1gbit", "runs": [{"hosts": 4, "ranks_per_host": 2, "placement": "interleaved", "report": {
        "results": [{"op": "all_reduce", "size_bytes": 1024, "explain": explain,
                     "backends": {b: {"time_us": t} for b, t in backends.items()}}]}}]}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_errors_and_picks(tmp_path):
    a = _run(tmp_path, "a.json", {"ringcomm[auto]": 105.0, "ringcomm[ring]": 200.0,
                                  "ringcomm[all_reduce:rabenseifner]": 100.0, "gloo": 900.0},
             [["rabenseifner", 120e-6], ["ring", 400e-6]])
    b = _run(tmp_path, "b.json", {"ringcomm": 300.0}, [["ring", 330e-6], ["rabenseifner", 1e-4]])
    out = io.StringIO()
    text = mc.report(mc.collect([a, f"{b}=rank-order"]), out)
    # rabenseifner +20% (within 25%), ring +100%, the rank-order ring +10%: 2 of 3
    assert "within 25% of the measured time: 2 of 3" in text
    # auto (105) is within 10% of the best (100); the run without auto is not judged
    assert "auto within 10% of the best measured algorithm: 1 of 1 sizes" in text
    assert "4x2 interleaved 1gbit rank-order" in text and "ring 300.0/330.0 (+10%)" in text
    assert mc.algo_of("ringcomm[all_reduce:hierarchical,broadcast:hierarchical]") == "hierarchical"
    assert mc.algo_of("gloo") is None
