"""The cost model `auto` picks algorithms with (native: csrc/comm/cost_model.h).

Each algorithm's time is an alpha-beta-gamma formula over the communicator's
topology: alpha (a message's latency), beta (seconds per byte of one stream)
and overhead (issuing one more message) for the links between ranks of one
host ("intra") and of different hosts ("inter"), gamma (seconds per byte
reduced), and nics (independent inter-host links per host, optional,
default 1: with one NIC per GPU the ranks of a host do not share one link).
The parameters are measured when a communicator is made (at most
~50 ms), read from a file `ringcomm-bench --calibrate` wrote
(RINGCOMM_COST_MODEL=<file>), or the built-in defaults
(RINGCOMM_COST_MODEL=default); rank 0's are broadcast, so every rank picks
alike.

    ringcomm.explain("all_reduce", 1 << 20)
    # [('rabenseifner', 0.00041), ('ring', 0.00048), ('recursive_doubling', 0.0009)]
"""
import json
import math
import os
import stat

from ringcomm import _C

# The fields of a parameter file and their sane ranges (a file is input like
# any other: a bad one is a ValueError naming it, never a silent misuse).
_LINK_RANGES = {"alpha": (1e-9, 10.0), "beta": (1e-15, 1e-3), "overhead": (0.0, 10.0)}
_GAMMA_RANGE = (1e-15, 1e-3)
_NICS_RANGE = (1, 1024)
# A family's fit (ringcomm-bench --calibrate): at each measured size, the
# measured time over the formula's (interpolated between sizes); beyond this
# range the formula or the measurement is broken, not the machine.
_FIT_RATIO = (0.02, 50.0)
_FIT_BYTES = (1, 1 << 40)
_MAX_FITS = 64
_MAX_FIT_POINTS = 32
MAX_FILE_BYTES = 1 << 16
FORMAT = "ringcomm-cost-model/1"


def _number(value, where, lo, hi):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r:.40}")
    if not lo <= value <= hi:
        raise ValueError(f"{where} = {value!r} is outside [{lo:g}, {hi:g}]")
    return float(value)


def check_params(params, where="cost model parameters"):
    """A validated copy of a parameter dict ({"intra": {...}, "inter": {...}, "gamma": g},
    optionally "nics": n, default 1)."""
    if not isinstance(params, dict):
        raise ValueError(f"{where}: expected an object, got {type(params).__name__}")
    out = {}
    for link in ("intra", "inter"):
        got = params.get(link)
        if not isinstance(got, dict):
            raise ValueError(f"{where}: '{link}' must be an object with alpha, beta and overhead")
        out[link] = {k: _number(got.get(k), f"{where}: {link}.{k}", lo, hi) for k, (lo, hi) in _LINK_RANGES.items()}
    out["gamma"] = _number(params.get("gamma"), f"{where}: gamma", *_GAMMA_RANGE)
    nics = params.get("nics", 1)
    if isinstance(nics, bool) or not isinstance(nics, int) or not _NICS_RANGE[0] <= nics <= _NICS_RANGE[1]:
        raise ValueError(f"{where}: nics must be an integer in [{_NICS_RANGE[0]}, {_NICS_RANGE[1]}], "
                         f"got {nics!r:.40}")
    out["nics"] = nics
    fit = params.get("fit")
    if fit is not None:
        out["fit"] = _check_fit(fit, where)
        # The topology the fit was measured on: [world size, hosts].
        fit_for = params.get("fit_for")
        if not (isinstance(fit_for, (list, tuple)) and len(fit_for) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 24 for v in fit_for)):
            raise ValueError(f"{where}: a fit needs fit_for = [world size, hosts] it was measured on, "
                             f"got {fit_for!r:.60}")
        out["fit_for"] = list(fit_for)
    out["source"] = str(params.get("source", "given"))[:200]
    return out


def _check_fit(fit, where):
    if not isinstance(fit, dict) or len(fit) > _MAX_FITS:
        raise ValueError(f"{where}: fit must be an object of at most {_MAX_FITS} "
                         f"\"op:family\": [[bytes, ratio], ...] entries")
    out = {}
    for name, points in fit.items():
        if not isinstance(name, str) or name.count(":") != 1 or len(name) > 64:
            raise ValueError(f"{where}: a fit is named op:family (e.g. all_reduce:ring), got {name!r:.70}")
        try:
            _C.check_algo(name)  # the op has that family (RINGCOMM_ALGO's per-op form)
        except ValueError as e:
            raise ValueError(f"{where}: fit {name}: {e}") from None
        if not isinstance(points, (list, tuple)) or not 1 <= len(points) <= _MAX_FIT_POINTS:
            raise ValueError(f"{where}: fit {name} must be a list of 1 to {_MAX_FIT_POINTS} [bytes, ratio] points")
        pts = []
        for pt in points:
            if not isinstance(pt, (list, tuple)) or len(pt) != 2:
                raise ValueError(f"{where}: fit {name}: a point is [bytes, ratio], got {pt!r:.60}")
            x = _number(pt[0], f"{where}: fit {name} bytes", *_FIT_BYTES)
            y = _number(pt[1], f"{where}: fit {name} ratio", *_FIT_RATIO)
            if pts and x <= pts[-1][0]:
                raise ValueError(f"{where}: fit {name}: the sizes must ascend")
            pts.append([x, y])
        out[name] = pts
    return out


def load(path):
    """The parameters in `path` (written by save / ringcomm-bench --calibrate)."""
    where = f"cost model file {path!r}"
    try:
        # O_NONBLOCK: a FIFO (or a device) must not block the open; only a
        # regular file is read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ValueError(f"{where}: cannot be read ({e.strerror or e})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{where}: not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{where}: cannot be read ({e.strerror or e})") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{where}: larger than {MAX_FILE_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{where}: not UTF-8 JSON ({e})") from None
    except RecursionError:  # arrays or objects nested thousands deep
        raise ValueError(f"{where}: not a ringcomm cost model (JSON nested too deeply)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{where}: not a ringcomm cost model (no \"format\": \"{FORMAT}\")")
    params = check_params(data.get("params"), where)
    params["source"] = f"file {os.path.abspath(path)}"
    return params


def save(path, params, **meta):
    """Writes `params` (and `meta`: the machine, the date, ...) as `path`, atomically."""
    params = check_params(params)
    params.pop("source", None)
    doc = {"format": FORMAT, "params": params, **meta}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def default_params():
    return _C.default_cost_params()


def model(hosts, ranks_per_host=None, params=None, *, slot_bytes=128 * 1024, oneshot_max_bytes=64 * 1024,
          check_agreement=True):
    """A free-standing model: `hosts` hosts of `ranks_per_host` ranks (host-
    contiguous), or `hosts` a list of each rank's host label (any placement,
    uneven hosts); `params` the defaults unless given."""
    if ranks_per_host is not None:
        if not (isinstance(hosts, int) and isinstance(ranks_per_host, int) and hosts >= 1 and ranks_per_host >= 1):
            raise ValueError("hosts and ranks_per_host must be positive integers")
        labels = [r // ranks_per_host for r in range(hosts * ranks_per_host)]
    else:
        labels = [int(h) for h in hosts]
    p = check_params(params) if params is not None else default_params()
    return _C.CostModel(labels, p, slot_bytes, oneshot_max_bytes, check_agreement)


# Pairs of each link kind whose figures are published (the median is used):
# enough to smooth one slow pair out, few enough that every rank reads them fast.
SAMPLE_PAIRS = 8


def ranks_by_host(host_labels):
    """Each host's ranks, ascending; hosts in the order of their lowest rank
    (as the native Topology numbers them)."""
    hosts = {}
    for r, h in enumerate(host_labels):
        hosts.setdefault(h, []).append(r)
    return list(hosts.values())


def measuring_pairs(host_labels):
    """The pairs that measure, all at once (comm/calibrate.cpp): inside each
    host local indices (2i, 2i+1); across hosts (2j, 2j+1) in host order,
    equal local index. Returns (intra, inter): lists of (a, b), a < b."""
    members = ranks_by_host(host_labels)
    intra = [(m[i], m[i + 1]) for m in members for i in range(0, len(m) - 1, 2)]
    inter = [(min(x, y), max(x, y)) for j in range(0, len(members) - 1, 2)
             for x, y in zip(members[j], members[j + 1])]
    return intra, inter


_FIGURES = ("alpha", "beta", "overhead")


def median(values, where):
    """The middle one of `values` (the upper of the two for an even count),
    each checked to be a finite number (`where` names them)."""
    for v in values:
        _number(v, f"measured {where}", -math.inf, math.inf)
    values = sorted(values)
    return values[len(values) // 2]


def for_topology(params, world_size, host_labels):
    """`params` without their fit when it was measured on another topology
    (another world size or number of hosts: its ratios say nothing here),
    the source saying so."""
    here = [world_size, len(set(host_labels))]
    if "fit" not in params or list(params.get("fit_for", ())) == here:
        return params
    out = {k: v for k, v in params.items() if k not in ("fit", "fit_for")}
    w, h = params.get("fit_for", (0, 0))
    out["source"] = (f"{params.get('source', 'given')}; its fit, measured on {w} ranks on {h} host(s), "
                     f"left out ({here[0]} on {here[1]} here)")[:200]
    return out


def agree(native, store, prefix, rank, world_size, mode, given, host_labels, timeout_s, alive=None):
    """The parameters every rank of a new communicator uses, the same on all:
    "default" the built-in ones; "file" rank 0's `given` (published through
    the store); "measure" what the measuring ranks find now (measure_links),
    published through the store by them and read by every rank. Sets them
    on `native` and returns them."""
    from ringcomm import bootstrap

    params = default_params()
    if world_size == 1 or mode == "default":
        native.set_cost_params(params)
        return native.cost_params()
    intra, inter = measuring_pairs(host_labels)
    mine = {}
    if mode == "file":
        if rank == 0:
            mine["params"] = given
        members = [0]
    else:
        def partner(pairs):
            return next((b if a == rank else a for a, b in pairs if rank in (a, b)), -1)

        figs = native.measure_links(partner(intra), partner(inter), 0)
        sample = {"intra": [a for a, _ in intra[:SAMPLE_PAIRS]], "inter": [a for a, _ in inter[:SAMPLE_PAIRS]]}
        for link, off in (("intra", 0), ("inter", 3)):
            if rank in sample[link]:
                mine[link] = dict(zip(_FIGURES, figs[off:off + 3]))
        if rank == 0:
            mine["gamma"] = figs[6]
        members = sorted({0, *sample["intra"], *sample["inter"]})
    got = bootstrap.exchange(store, prefix, rank, world_size, mine, timeout_s, alive=alive, members=members)
    if mode == "file":
        params = got[0].get("params")
        params = {**check_params(params, "rank 0's cost model parameters in the store"),
                  "source": "file (rank 0's RINGCOMM_COST_MODEL)"}
        params = for_topology(params, world_size, host_labels)
    else:
        for link in ("intra", "inter"):
            recs = [got[r].get(link) for r in sample[link]]
            if any(not isinstance(x, dict) for x in recs):
                raise ValueError(f"ringcomm: a {link}-host figure in the store is malformed: {recs!r:.200}")
            if recs:
                params[link] = {k: median([x.get(k) for x in recs], f"{link}.{k}") for k in _FIGURES}
        if inter:
            # The inter-host pairs of one host measured at once, sharing its
            # link: each saw its share of the bandwidth. The model charges a
            # step for its streams itself (cost_model.cpp), so beta here is
            # the whole link's.
            per_host = {}
            for a, b in inter:
                for r in (a, b):
                    per_host[host_labels[r]] = per_host.get(host_labels[r], 0) + 1
            params["inter"]["beta"] /= max(per_host.values())
        params["gamma"] = got[0].get("gamma")
        params = {**check_params(params, "the measured cost model parameters in the store"), "source": "measured"}
    native.set_cost_params(params)
    return native.cost_params()
