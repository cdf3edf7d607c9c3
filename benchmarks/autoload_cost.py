"""What ringcomm's "torch.backends" entry point costs every `import torch`.

torch runs each entry point of that group inside `import torch`
(TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns the whole mechanism off). ringcomm's
(_ringcomm_autoload) only registers the name; this prints:

1. wall time of `python -c "import torch"` in fresh processes, the cases
   taking turns: autoload off, autoload on (the default: ringcomm's hook runs),
   and, for scale, `import torch, ringcomm.torch_backend` (what the hook would
   cost if it imported the backend itself);
2. measured inside one process: torch's scan of the entry points (it scans
   whenever autoload is on, whatever is installed), the import of
   _ringcomm_autoload and the registration (the hook's own cost), and the
   import of ringcomm.torch_backend after that;
3. -X importtime's figure for torch (it does not list modules imported by
   importlib.import_module, as entry points are: hence 2).

    python benchmarks/autoload_cost.py [--repeats 15]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

from ringcomm.bench.report import _cpu_model

CASES = {
    "autoload off (TORCH_DEVICE_BACKEND_AUTOLOAD=0)": ("import torch", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
    "autoload on (default; ringcomm's hook runs)": ("import torch", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}),
    "autoload off + import ringcomm.torch_backend": ("import torch, ringcomm.torch_backend",
                                                     {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
}

IN_PROCESS = """
import time
t0 = time.perf_counter()
import torch, torch.distributed as dist
t1 = time.perf_counter()
from importlib.metadata import entry_points
eps = list(entry_points(group="torch.backends"))
t2 = time.perf_counter()
import _ringcomm_autoload
t3 = time.perf_counter()
_ringcomm_autoload._autoload()
t4 = time.perf_counter()
assert "ringcomm" in dist.Backend.backend_list
import ringcomm.torch_backend
t5 = time.perf_counter()
print(f"{(t1 - t0) * 1e3:.1f} {(t2 - t1) * 1e3:.2f} {(t3 - t2) * 1e3:.3f} {(t4 - t3) * 1e3:.3f} "
      f"{(t5 - t4) * 1e3:.1f} {len(eps)}")
"""


def run(code, env_extra, timeout=120):
    env = dict(os.environ, **env_extra)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{code!r} failed:\n{r.stderr[-2000:]}")
    return elapsed, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    print(f"CPU: {_cpu_model()}, {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    print("(the machine may be shared: the cases take turns so that load falls on all of them alike)")
    run("import torch", {})  # warm the page cache
    times = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, (code, env) in CASES.items():
            times[name].append(run(code, env)[0])
    print(f"\n1. wall time of a fresh process, {args.repeats} repeats each (seconds)")
    print(f"{'case':<48} {'median':>7} {'min':>7} {'max':>7}")
    for name, ts in times.items():
        print(f"{name:<48} {statistics.median(ts):7.3f} {min(ts):7.3f} {max(ts):7.3f}")
    base = statistics.median(times[next(iter(CASES))])
    for name, ts in list(times.items())[1:]:
        print(f"  {name}: {1e3 * (statistics.median(ts) - base):+.1f} ms against autoload off")

    print("\n2. inside one process (autoload off, then the hook's steps by hand), ms; 5 processes")
    print(f"{'import torch':>13} {'scan entry points':>18} {'import hook':>12} {'register':>9} "
          f"{'import ringcomm.torch_backend (what an eager hook would add)':>60}")
    for _ in range(5):
        _, r = run(IN_PROCESS, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        imp, scan, hook, reg, eager, n = r.stdout.split()
        print(f"{imp:>13} {scan:>18} {hook:>12} {reg:>9} {eager:>60}   ({n} torch.backends entry point(s))")

    print("\n3. python -X importtime -c 'import torch' (autoload on; self us | cumulative us)")
    _, r = run("import torch", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "PYTHONPROFILEIMPORTTIME": "1"})
    total = next((line for line in reversed(r.stderr.splitlines()) if line.rstrip().endswith("| torch")), "")
    print(f"  {total.strip()}")
    print("  (torch loads entry points with importlib.import_module, which -X importtime does not list:\n"
          "   the hook's lines are missing there, hence the timing by hand in 2.)")


if __name__ == "__main__":
    main()
