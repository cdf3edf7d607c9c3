"""The cost model (csrc/comm/cost_model.cpp): its formulas against hand
computations, its picks, its parameter files as hostile input, and in spawned
groups: parameters agreed on every rank, explain(), files, splits."""

import json
import math
import os
import random
import re
import threading
import time

import pytest

import harness
import ringcomm
from ringcomm import cost_model

P = {"intra": {"alpha": 1e-6, "beta": 1e-9, "overhead": 0.0},
     "inter": {"alpha": 50e-6, "beta": 4e-9, "overhead": 0.0}, "gamma": 0.5e-9}


def times(m, op, nbytes):
    return dict(m.predict(op, nbytes))


def test_formulas_match_hand_computation():
    a_i, b_i, a_e, b_e, g = 1e-6, 1e-9, 50e-6, 4e-9, 0.5e-9
    s = 1 << 20
    one = times(cost_model.model(1, 4, P), "all_reduce", s)
    assert one["ring"] == pytest.approx(6 * a_i + 2 * 3 / 4 * s * b_i + 3 / 4 * s * g)
    assert one["recursive_doubling"] == pytest.approx(2 * (a_i + s * b_i + s * g))
    # Rabenseifner over 4: halving moves S/2 then S/4 (and reduces them), doubling S/4 then S/2.
    assert one["rabenseifner"] == pytest.approx(4 * a_i + 1.5 * s * b_i + 0.75 * s * g)
    assert "hierarchical" not in one  # one host
    # 2 hosts x 2: the host-contiguous ring crosses once per host boundary (1 stream per host).
    two = times(cost_model.model(2, 2, P), "all_reduce", s)
    assert two["ring"] == pytest.approx(6 * a_e + 1.5 * s * b_e + 0.75 * s * g)
    # Interleaved (hosts 0 1 0 1): the first doubling exchange (r ^ 1) crosses for
    # both ranks of each host (2 streams share its link), the second (r ^ 2) stays local.
    inter = times(cost_model.model([0, 1, 0, 1], params=P), "all_reduce", s)
    assert inter["recursive_doubling"] == pytest.approx((a_e + 2 * s * b_e + s * g) + (a_i + s * b_i + s * g))
    # The same ring as contiguous: rings always run in host order.
    assert inter["ring"] == pytest.approx(two["ring"])
    # Hierarchical over 2 x 2: intra reduce-scatter + all-gather (1 step each, half
    # the buffer), the inter ring of a half buffer (2 rings share each host's link).
    assert two["hierarchical"] == pytest.approx(2 * a_i + 2 * a_e + 0.5 * (2 * s * b_i + s * g)
                                                + (s * b_e * 2 + 0.5 * s * g) / 2)
    # Binomial broadcast over 5: 3 levels; level m=4 sends 0 -> 4 only.
    b = times(cost_model.model(1, 5, P), "broadcast", s)
    # Its covering form carries the agreement check in the same 3 rounds (every rank
    # sends in each): nothing on top. The chain runs the dissemination barrier's 3
    # rounds over 5 first.
    assert b["tree"] == pytest.approx(3 * (a_i + s * b_i))
    unchecked = times(cost_model.model(1, 5, P, check_agreement=False), "broadcast", s)
    assert unchecked["tree"] == pytest.approx(b["tree"])
    assert b["ring"] == pytest.approx(unchecked["ring"] + 3 * a_i)


def test_predictions_sorted_and_pick_first():
    for hosts, per in [(1, 2), (1, 7), (8, 1), (4, 2), (3, 5), (64, 8), (2048, 8)]:
        m = cost_model.model(hosts, per, P)
        for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "scatter", "gather",
                   "all_to_all", "barrier"):
            for nbytes in (0, 8, 4096, 1 << 18, 1 << 26):
                got = m.predict(op, nbytes)
                assert got, (hosts, per, op)
                secs = [t for _, t in got]
                assert secs == sorted(secs) and all(math.isfinite(t) and t >= 0 for t in secs)


def test_picks_follow_the_regime():
    small, large = 8, 64 << 20
    m = cost_model.model(8, 1, P)
    assert m.predict("all_reduce", small)[0][0] in ("oneshot", "recursive_doubling")
    assert m.predict("all_reduce", large)[0][0] in ("ring", "rabenseifner")
    assert m.predict("broadcast", small)[0][0] == "tree"
    assert m.predict("broadcast", large)[0][0] == "ring"  # the pipelined chain
    # All blocks at once cost one latency when issuing a message costs nothing;
    # when it costs most of a latency, Bruck's log2 rounds win.
    assert m.predict("all_gather", 4096)[0][0] == "direct"
    costly = {**P, "inter": {**P["inter"], "overhead": 40e-6}}
    assert cost_model.model(8, 1, costly).predict("all_gather", 4096)[0][0] == "bruck"
    # one-shot's scratch is world x S: never a candidate above its cap
    assert "oneshot" not in dict(m.predict("all_reduce", 1 << 20))


BAD_PARAMS = [
    None, [], "x", {}, {"intra": P["intra"], "inter": P["inter"]},
    {**P, "gamma": float("nan")}, {**P, "gamma": -1.0}, {**P, "gamma": True}, {**P, "gamma": "1e-9"},
    {**P, "intra": {"alpha": 1e-6, "beta": 1e-9}}, {**P, "inter": {**P["inter"], "alpha": float("inf")}},
    {**P, "inter": {**P["inter"], "beta": 1.0}}, {**P, "intra": []},
]


@pytest.mark.parametrize("bad", BAD_PARAMS)
def test_bad_parameters_are_value_errors(bad):
    with pytest.raises(ValueError):
        cost_model.check_params(bad)


def test_parameter_files(tmp_path):
    good = tmp_path / "good.json"
    cost_model.save(str(good), P, cpu="test")
    got = cost_model.load(str(good))
    assert got["intra"] == P["intra"] and got["gamma"] == P["gamma"] and got["source"].startswith("file ")
    cases = {
        "missing": None,
        "empty": b"",
        "binary": bytes(range(256)) * 3,
        "not-object": b"[1, 2]",
        "no-format": json.dumps({"params": P}).encode(),
        "wrong-format": json.dumps({"format": "other/1", "params": P}).encode(),
        "bad-value": json.dumps({"format": cost_model.FORMAT, "params": {**P, "gamma": 5.0}}).encode(),
        "huge": b" " * (cost_model.MAX_FILE_BYTES + 10),
        "nested-arrays": b"[" * 30000 + b"]" * 30000,  # a RecursionError in json, not a ValueError
        "nested-objects": b'{"a":' * 10000 + b"1" + b"}" * 10000,
    }
    rng = random.Random(7)
    for i in range(50):
        cases[f"random{i}"] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        doc = json.dumps({"format": cost_model.FORMAT, "params": P})
        cut = rng.randrange(len(doc))
        cases[f"cut{i}"] = doc[:cut].encode()
    for name, data in cases.items():
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        with pytest.raises(ValueError, match="cost model file"):
            cost_model.load(str(path))
    # Not regular files: a directory, a FIFO nobody writes (open() would block
    # forever), a character device.
    os.mkfifo(tmp_path / "fifo")
    for path, why in ((tmp_path, "cannot be read|not a regular file"), (tmp_path / "fifo", "not a regular file"),
                      ("/dev/zero", "not a regular file")):
        got = []

        def load(path=path):
            try:
                cost_model.load(str(path))
                got.append("loaded")
            except ValueError as e:
                got.append(str(e))

        t = threading.Thread(target=load, daemon=True)
        t.start()
        t.join(10)
        assert got, f"cost_model.load({path}) still blocked after 10 s"
        assert re.search(why, got[0]), got[0]


FIT = {"all_reduce:ring": [[16, 2.0], [4096, 0.5]]}


def test_fit_scales_the_formula_interpolated_in_log_size():
    plain = cost_model.model(8, 1, P)
    fitted = cost_model.model(8, 1, {**P, "fit": FIT, "fit_for": [8, 8]})
    ring = lambda m, s: times(m, "all_reduce", s)["ring"]  # noqa: E731
    assert ring(fitted, 16) == pytest.approx(2.0 * ring(plain, 16))
    assert ring(fitted, 4) == pytest.approx(2.0 * ring(plain, 4))          # below the first size: its ratio
    assert ring(fitted, 256) == pytest.approx(1.25 * ring(plain, 256))     # halfway in log2: 4 .. 12
    assert ring(fitted, 1 << 20) == pytest.approx(0.5 * ring(plain, 1 << 20))  # above the last: its ratio
    for s in (16, 256, 1 << 20):  # the other families are untouched
        assert times(fitted, "all_reduce", s)["rabenseifner"] == times(plain, "all_reduce", s)["rabenseifner"]
    # The pick follows the corrected formula: at 1 MiB ring (x0.5) beats Rabenseifner.
    assert fitted.predict("all_reduce", 1 << 20)[0][0] == "ring"
    assert plain.predict("all_reduce", 1 << 20)[0][0] != "ring"


BAD_FITS = [
    [], "x", {"ring": [[16, 1.0]]}, {"all_reduce:nope": [[16, 1.0]]}, {"broadcast:rabenseifner": [[16, 1.0]]},
    {"all_reduce:ring": []}, {"all_reduce:ring": [[16, 0.0]]}, {"all_reduce:ring": [[16, -1.0]]},
    {"all_reduce:ring": [[16, float("nan")]]}, {"all_reduce:ring": [[0, 1.0]]},
    {"all_reduce:ring": [[4096, 1.0], [16, 1.0]]}, {"all_reduce:ring": [[16, 1.0], [16, 2.0]]},
    {"all_reduce:ring": [[16, 1.0, 3]]}, {"all_reduce:ring": [["16", 1.0]]}, {"all_reduce:ring": [[16, True]]},
    {"all_reduce:ring": [[16, 1000.0]]}, {"all_reduce:ring": [[2 ** i, 1.0] for i in range(40)]},
    {f"all_reduce:ring{i}": [[16, 1.0]] for i in range(100)},
]


@pytest.mark.parametrize("bad", BAD_FITS)
def test_bad_fits_are_value_errors(bad):
    with pytest.raises(ValueError):
        cost_model.check_params({**P, "fit": bad, "fit_for": [8, 8]})


def test_bad_fits_are_refused_natively_too():
    # The native model checks what it is given, whatever the Python side did.
    for bad in ({"all_reduce:nope": [[16, 1.0]]}, {"all_reduce:ring": [[4096, 1.0], [16, 1.0]]},
                {"all_reduce:ring": [[16, -1.0]]}, {"ring": [[16, 1.0]]}):
        with pytest.raises(ValueError):
            ringcomm._C.CostModel([0] * 4, {**P, "fit": bad}, 128 * 1024, 64 * 1024, True)


def test_a_fit_needs_the_topology_it_was_measured_on():
    for fit_for in (None, [8], [8, 0], [8, True], "8x8", [8.0, 8]):
        with pytest.raises(ValueError, match="fit_for"):
            cost_model.check_params({**P, "fit": FIT, "fit_for": fit_for})
    p = cost_model.check_params({**P, "fit": FIT, "fit_for": [8, 8]})
    assert cost_model.for_topology(p, 8, list(range(8))) is p
    other = cost_model.for_topology(p, 4, list(range(4)))
    assert "fit" not in other and "fit_for" not in other and "left out" in other["source"]
    assert cost_model.for_topology(p, 8, [0, 0, 1, 1, 2, 2, 3, 3])["source"].endswith("(8 on 4 here)")


def _fitted(comm, _):
    """explain() with a file's fit: used when its topology is this one."""
    fails = []
    params = comm.cost_params()
    plain = cost_model.model(comm.host_of(), params={k: v for k, v in params.items()
                                                         if k not in ("fit", "fit_for")})
    want_fit = os.environ["EXPECT_FIT"] == "1"
    got = dict(ringcomm.explain("all_reduce", 16))["ring"]
    base = dict(plain.predict("all_reduce", 16))["ring"]
    if want_fit and not ("fit" in params and got == pytest.approx(2.0 * base)):
        fails.append(f"the fit is not used: {params} ring at 16 B {got} vs formula {base}")
    if not want_fit and ("fit" in params or got != pytest.approx(base) or "left out" not in params["source"]):
        fails.append(f"a fit of another topology is used: {params}, ring at 16 B {got} vs formula {base}")
    sub = comm.split([0])  # one rank: another topology, so the inherited fit is left out
    if sub is not None:
        if "fit" in sub.cost_params():
            fails.append(f"a split of 1 rank kept the fit of {params.get('fit_for')}")
        sub.close()
    return {"fails": fails}


def test_file_fit_is_used_on_its_topology_only(tmp_path):
    for fit_for, expect in (([2, 1], "1"), ([4, 1], "0")):
        path = tmp_path / f"fit{expect}.json"
        cost_model.save(str(path), {**P, "fit": FIT, "fit_for": fit_for})
        results = harness.run_ranks(_fitted, 2, (None,), env={"RINGCOMM_COST_MODEL": str(path), "EXPECT_FIT": expect},
                                    hard_timeout=90)
        for r, res in enumerate(results):
            assert not res["fails"], (r, res["fails"])


def _agreed(comm, _):
    fails = []
    params = comm.cost_params()
    if comm.world_size > 1 and params["source"] != os.environ.get("EXPECT_SOURCE", "measured"):
        if not params["source"].startswith(os.environ.get("EXPECT_SOURCE", "measured")):
            fails.append(f"source {params['source']}")
    ex = ringcomm.explain("all_reduce", 8)
    names = [n for n, _ in ex]
    secs = [t for _, t in ex]
    forced = os.environ.get("EXPECT_FIRST")
    if forced:
        if names[0] != forced:
            fails.append(f"explain puts {names[0]} first, not the forced {forced}")
    elif secs[0] != min(secs):
        fails.append(f"auto's pick {ex[0]} is not the fastest of {ex}")
    if len(set(names)) != len(names):
        fails.append(f"explain lists a name twice: {names}")
    for bad_op, bad_n, err in (("allreduce", 8, ValueError), ("all_reduce", -1, ValueError),
                               ("all_reduce", 1.5, TypeError), (3, 8, TypeError)):
        try:
            ringcomm.explain(bad_op, bad_n)
            fails.append(f"explain({bad_op!r}, {bad_n!r}) did not raise")
        except err:
            pass
    sub = comm.split([0, 1])
    sub_params = None if sub is None else sub.cost_params()
    if sub is not None:
        sub.close()
    return {"params": params, "fails": fails, "sub": sub_params}


def _check_agreed(results):
    for r, res in enumerate(results):
        assert not res["fails"], (r, res["fails"])
    first = results[0]["params"]
    for r, res in enumerate(results):
        assert res["params"] == first, f"rank {r} has other parameters: {res['params']} vs {first}"
        if res["sub"] is not None:
            assert res["sub"] == first, "a split must inherit its parent's parameters"


def test_measured_parameters_are_the_same_on_every_rank():
    results = harness.run_ranks(_agreed, 3, (None,), rank_env={0: {"RINGCOMM_HOST_ID": "a"},
                                                               1: {"RINGCOMM_HOST_ID": "b"},
                                                               2: {"RINGCOMM_HOST_ID": "a"}},
                                hard_timeout=90)
    _check_agreed(results)
    p = results[0]["params"]
    # Both link kinds were measured here (ranks 0 and 2 share a host, 1 is on another).
    assert p["intra"] != ringcomm._C.default_cost_params()["intra"]
    assert p["inter"] != ringcomm._C.default_cost_params()["inter"]


def test_file_and_forced_algorithm(tmp_path):
    path = tmp_path / "model.json"
    cost_model.save(str(path), {**P, "nics": 2})  # nics travels with the file
    results = harness.run_ranks(_agreed, 2, (None,), env={"RINGCOMM_COST_MODEL": str(path),
                                                          "RINGCOMM_ALGO": "all_reduce:ring",
                                                          "EXPECT_SOURCE": "file", "EXPECT_FIRST": "ring"},
                                hard_timeout=90)
    _check_agreed(results)
    assert results[0]["params"]["intra"] == P["intra"] and results[0]["params"]["nics"] == 2
    results = harness.run_ranks(_agreed, 2, (None,), env={"RINGCOMM_COST_MODEL": "default",
                                                          "EXPECT_SOURCE": "default"}, hard_timeout=90)
    _check_agreed(results)


def _init_fails(comm, paths):
    """init() with each of `paths` as RINGCOMM_COST_MODEL: (error text, seconds) each."""
    ctx = harness.context()
    out = []
    for path in paths:
        os.environ["RINGCOMM_COST_MODEL"] = path
        t0 = time.monotonic()
        try:
            ringcomm.init(rank=ctx.rank, world_size=ctx.world_size, store=ctx.store, timeout=20)
            out.append(("init succeeded", time.monotonic() - t0))
        except ValueError as e:
            out.append((str(e), time.monotonic() - t0))
    return out


def test_bad_file_fails_init_on_every_rank(tmp_path):
    """Rank 0 cannot use its file: every rank's init raises at once, saying why."""
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\xffnot json")
    nested = tmp_path / "nested.json"
    nested.write_bytes(b"[" * 30000 + b"]" * 30000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [(garbage, "not UTF-8 JSON"), (nested, "nested too deeply"), (fifo, "not a regular file")]
    results = harness.run_ranks(_init_fails, 3, ([str(p) for p, _ in cases],), init=False, hard_timeout=90)
    for r, got in enumerate(results):
        for (path, why), (msg, took) in zip(cases, got):
            assert "RINGCOMM_COST_MODEL on rank 0" in msg and why in msg, (r, path, msg)
            assert took < 10, (r, path, took, msg)  # never the whole timeout


def test_nics_divide_the_inter_host_streams():
    """With `nics` independent links per host (one NIC per GPU), the cross-host
    transfers of a step share ceil(streams / nics) of a link, not one link."""
    a_i, b_i, a_e, b_e, g = 1e-6, 1e-9, 50e-6, 4e-9, 0.5e-9
    s = 1 << 20
    for nics, share in ((1, 4), (2, 2), (3, 2), (4, 1), (8, 1)):
        t = times(cost_model.model(2, 4, {**P, "nics": nics}), "all_reduce", s)
        # 2 hosts x 4: doubling's masks 1 and 2 stay on a host, mask 4 sends all
        # 4 ranks of each host across at once.
        assert t["recursive_doubling"] == pytest.approx(2 * (a_i + s * b_i + s * g) + a_e + share * s * b_e + s * g)
        # Hierarchical: 4 inter-host rings (one per local index) of a quarter buffer each.
        assert t["hierarchical"] == pytest.approx(6 * a_i + 2 * a_e + 0.75 * (2 * s * b_i + s * g)
                                                  + (s * b_e * share + 0.5 * s * g) / 4)
        # The host-contiguous ring crosses once per host boundary: one stream, nics change nothing.
        assert t["ring"] == pytest.approx(14 * a_e + 14 / 8 * s * b_e + 7 / 8 * s * g)
        # One-shot (1 KiB): each of a host's 4 ranks sends to the other host's 4.
        one = times(cost_model.model(2, 4, {**P, "nics": nics}), "all_reduce", 1024)["oneshot"]
        assert one == pytest.approx(a_e + share * 4 * 1024 * b_e + 7 * 1024 * g)


def test_nics_default_is_one_link_per_host():
    for hosts in ([0, 1, 0, 1, 2, 2], [0] * 3 + [1] * 5, list(range(6))):
        without = cost_model.model(hosts, params=P)
        one = cost_model.model(hosts, params={**P, "nics": 1})
        for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"):
            for nbytes in (8, 1 << 16, 1 << 24):
                assert without.predict(op, nbytes) == one.predict(op, nbytes), (hosts, op, nbytes)
    assert cost_model.default_params()["nics"] == 1
    assert cost_model.check_params(P)["nics"] == 1
    assert cost_model.model(2, 2, {**P, "nics": 8}).params()["nics"] == 8


@pytest.mark.parametrize("nics", [0, -1, 1.5, True, "2", None, 1025])
def test_bad_nics_are_value_errors(nics, tmp_path):
    with pytest.raises(ValueError, match="nics"):
        cost_model.check_params({**P, "nics": nics})
    path = tmp_path / "nics.json"
    path.write_text(json.dumps({"format": cost_model.FORMAT, "params": {**P, "nics": nics}}))
    with pytest.raises(ValueError, match="cost model file"):
        cost_model.load(str(path))


def test_native_model_rejects_nics_below_one():
    with pytest.raises(ValueError, match="nics"):
        ringcomm._C.CostModel([0, 1], {**P, "nics": 0})


def test_nics_in_parameter_files(tmp_path):
    path = tmp_path / "dgx.json"
    cost_model.save(str(path), {**P, "nics": 8})
    assert cost_model.load(str(path))["nics"] == 8
    old = tmp_path / "old.json"  # a file written before nics existed
    old.write_text(json.dumps({"format": cost_model.FORMAT, "params": P}))
    assert cost_model.load(str(old))["nics"] == 1


def _pull_send_after_calibration(comm, _):
    import time

    import numpy as np

    r = comm.rank
    fails = []
    for n in (8, 1 << 20):
        x = np.arange(n, dtype=np.uint8) if r == 0 else np.zeros(n, np.uint8)
        if r == 0:
            comm.send(x, 1)  # returns once rank 1 has read it (a pull send)...
            x[:] = 7         # ...so this cannot reach rank 1
        else:
            time.sleep(0.2)
            comm.recv(x, 0)
            if not np.array_equal(x, np.arange(n, dtype=np.uint8)):
                fails.append(f"{n} bytes: rank 1 got {x[:8]} (the sender returned before it was read)")
    return fails


def test_pull_sends_after_calibration_wait_for_their_reader():
    """Calibration's sends are numbered like any (with pulls forced they are pulls):
    a pull send completes when the reader's count of messages read reaches its
    number, so the numbering must go on after calibration, not restart."""
    results = harness.run_ranks(_pull_send_after_calibration, 2, (None,),
                                env={"RINGCOMM_ALGO": "pull", "RINGCOMM_PULL_MIN_BYTES": 1}, hard_timeout=60)
    harness.assert_no_failures(results)
