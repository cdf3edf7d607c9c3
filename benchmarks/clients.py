"""Third-party training clients on ringcomm against gloo: losses, parameters, step times.

Each client example in examples/clients/ trains the same MLP on the same
per-rank batches; this runs each one twice per repeat, with --backend gloo and
--backend ringcomm (2 CPU processes, the launches taking turns), and prints
whether the losses and final parameters agree and each backend's median step
time (per step the slowest rank, after the first --warmup steps; the median
over steps and repeats). tests/test_clients.py uses run_client() and compare()
at a small size.

    python benchmarks/clients.py                       # every installed client
    python benchmarks/clients.py --clients deepspeed-zero2 --steps 50 --width 1024

Each launch has a hard timeout (--timeout): when it expires the launcher
(torchrun / accelerate launch) and every process under it are killed.
DeepSpeed builds its CPU shared-memory op (deepspeed_shm_comm, in
~/.cache/torch_extensions or TORCH_EXTENSIONS_DIR) the first time it runs;
run once before timing on a fresh machine, or give that run more time.
"""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile

import torch

from ringcomm.bench.report import _cpu_model

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "clients")

# name: (package it needs, example, --variant, launcher)
CLIENTS = {
    "lightning-ddp": ("lightning", "train_lightning.py", "ddp", "torchrun"),
    "lightning-model_parallel": ("lightning", "train_lightning.py", "model_parallel", "torchrun"),
    "accelerate-torchrun": ("accelerate", "train_accelerate.py", "ddp", "torchrun"),
    "accelerate-launch": ("accelerate", "train_accelerate.py", "ddp", "accelerate"),
    "deepspeed-zero1": ("deepspeed", "train_deepspeed.py", "zero1", "torchrun"),
    "deepspeed-zero2": ("deepspeed", "train_deepspeed.py", "zero2", "torchrun"),
    "transformers-trainer": ("transformers", "train_transformers.py", "trainer", "torchrun"),
    "ray-train": ("ray", "train_ray.py", "torch_trainer", "python"),
    "torchrun-restart": ("torch", "train_torchrun_restart.py", "ddp", "torchrun-restart"),
    "torch-compile": ("torch", "train_torch_features.py", "compile", "torchrun"),
    "torch-dtensor": ("torch", "train_torch_features.py", "dtensor", "torchrun"),
    "torch-pipelining-gpipe": ("torch", "train_torch_features.py", "gpipe", "torchrun"),
    "torch-pipelining-interleaved": ("torch", "train_torch_features.py", "interleaved", "torchrun"),
    "torch-dcp": ("torch", "train_torch_features.py", "dcp", "torchrun"),
}
NPROC = 2


class ClientFailed(AssertionError):
    """A launch exited non-zero, ran past its timeout, or left no results."""


def available(name):
    """None if the client's package is installed, else the reason to skip it."""
    package = CLIENTS[name][0]
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install '.[clients]')"
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(launcher, script, args):
    port = str(_free_port())
    bindir = os.path.dirname(sys.executable)
    if launcher in ("torchrun", "torchrun-restart"):
        # The restart client's survivor must raise, naming the lost rank, before the agent
        # stops it: torchrun's agent looks at its workers every --monitor-interval (0.1 s by
        # default) and SIGTERMs the survivors of a failed one. On a loaded machine 0.1 s was
        # sometimes too short for the survivor to raise through DDP's autograd hook and write
        # its report (1 launch of 6 with three busy loops on the 2 cores); 2 s leaves it room
        # (restart_s grows by up to the interval, for gloo and ringcomm alike).
        restarts = (["--max-restarts", "2", "--monitor-interval", "2"]
                    if launcher == "torchrun-restart" else [])
        return [os.path.join(bindir, "torchrun"), "--nproc-per-node", str(NPROC), "--master-port", port,
                *restarts, script, *args]
    if launcher == "python":  # the client starts its own workers (Ray)
        return [sys.executable, script, *args]
    return [os.path.join(bindir, "accelerate"), "launch", "--multi_gpu", "--num_processes", str(NPROC),
            "--num_machines", "1", "--main_process_port", port, "--mixed_precision", "no",
            "--dynamo_backend", "no", script, *args]


def _children():
    """{parent pid: [child pids]} of every process now running (Linux /proc)."""
    tree = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(pid))
    return tree


def kill_tree(pid):
    """SIGKILLs `pid`, its process group and all its descendants. A process group
    is not enough: torchrun starts each worker in a session of its own, and an
    orphaned worker would hold the output pipe (and wait for the dead agent's
    store) for minutes."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(tree.get(p, []))
    for p in found:
        try:
            os.killpg(p, signal.SIGKILL) if p == pid else os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_client(name, backend, *, steps=6, width=32, timeout=240.0, out=None, extra_args=()):
    """Launches client `name` on `backend` (the script's own `extra_args` appended);
    returns its per-rank results (the rank{r}.json fields, with "params" the final
    parameters)."""
    _, script, variant, launcher = CLIENTS[name]
    own = out is None
    out = out or tempfile.mkdtemp(prefix=f"ringcomm_{name}_{backend}_")
    try:
        cmd = _command(launcher, os.path.join(EXAMPLES, script),
                       ["--backend", backend, "--variant", variant, "--steps", str(steps), "--width", str(width),
                        "--out", out, *extra_args])
        # PYTHONFAULTHANDLER: a rank that dies of a signal prints every thread's stack.
        env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # the examples rely on ringcomm's entry point
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env=env)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            output, _ = proc.communicate(timeout=30)
            raise ClientFailed(f"{name} on {backend} did not finish within {timeout:.0f} s "
                               f"({' '.join(cmd)}):\n{output[-4000:]}") from None
        if proc.returncode != 0:
            raise ClientFailed(f"{name} on {backend} exited with {proc.returncode} ({' '.join(cmd)}):\n"
                               f"{output[-4000:]}")
        ranks = []
        for r in range(NPROC):
            try:
                with open(os.path.join(out, f"rank{r}.json")) as f:
                    result = json.load(f)
                result["params"] = torch.load(os.path.join(out, f"rank{r}.pt"))
            except OSError as e:
                raise ClientFailed(f"{name} on {backend}: rank {r} left no results ({e}):\n{output[-4000:]}")
            ranks.append(result)
        return ranks
    finally:
        if own:
            shutil.rmtree(out, ignore_errors=True)


def compare(ref, got, rtol=1e-5, atol=1e-6):
    """Failure strings: `got` (ringcomm) against `ref` (gloo), rank by rank, plus the
    largest differences (exactly equal when both are 0)."""
    fails, loss_diff, param_diff = [], 0.0, 0.0
    for r, (a, b) in enumerate(zip(got, ref)):
        for key in ("losses", "mean_losses"):
            if key not in b:
                continue
            la, lb = torch.tensor(a[key]), torch.tensor(b[key])
            if la.shape != lb.shape:
                fails.append(f"rank {r}: {len(a[key])} {key}, gloo {len(b[key])}")
                continue
            loss_diff = max(loss_diff, (la - lb).abs().max().item() if la.numel() else 0.0)
            if not torch.allclose(la, lb, rtol=rtol, atol=atol):
                fails.append(f"rank {r}: {key} {a[key][:4]}... differ from gloo's {b[key][:4]}...")
        if len(a["params"]) != len(b["params"]):
            fails.append(f"rank {r}: {len(a['params'])} parameters, gloo {len(b['params'])}")
        for i, (pa, pb) in enumerate(zip(a["params"], b["params"])):
            if pa.shape != pb.shape:
                fails.append(f"rank {r}: parameter {i} has shape {tuple(pa.shape)}, gloo {tuple(pb.shape)}")
                continue
            param_diff = max(param_diff, (pa - pb).abs().max().item())
            if not torch.allclose(pa, pb, rtol=rtol, atol=atol):
                fails.append(f"rank {r}: parameter {i} differs from gloo's by {(pa - pb).abs().max().item():.3g}")
        if a.get("comm_failures"):
            fails.extend(a["comm_failures"])
    return fails, loss_diff, param_diff


def step_times(ranks, warmup):
    """Per step, the slowest rank's time, after the first `warmup` steps."""
    return [max(steps) for steps in zip(*(r["step_times"] for r in ranks))][warmup:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default=",".join(CLIENTS), help=f"comma list of {', '.join(CLIENTS)}")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--width", type=int, default=512, help="hidden width (3 layers: ~width^2 parameters)")
    ap.add_argument("--repeats", type=int, default=2, help="launches per backend, taking turns")
    ap.add_argument("--timeout", type=float, default=600.0, help="hard timeout of one launch, seconds")
    args = ap.parse_args()
    names = [n for n in args.clients.split(",") if n]
    unknown = [n for n in names if n not in CLIENTS]
    if unknown:
        ap.error(f"unknown clients {unknown}; choose from {list(CLIENTS)}")
    import ringcomm

    print(f"CPU: {_cpu_model()}, {os.cpu_count()} CPUs; torch {torch.__version__}, ringcomm {ringcomm.__version__}; "
          f"{NPROC} processes, width {args.width} ({(16 * args.width + args.width ** 2 + 4 * args.width) * 4 / 2**20:.2f}"
          f" MiB of float32 gradients), {args.steps} steps, {args.repeats} repeats")
    header = (f"{'client':<26} {'losses/params vs gloo':<30} {'gloo ms/step':>12} {'ringcomm ms/step':>16} "
              f"{'gloo/ringcomm':>13}")
    print(header)
    for name in names:
        reason = available(name)
        if reason:
            print(f"{name:<26} skipped: {reason}")
            continue
        times = {"gloo": [], "ringcomm": []}
        verdicts = []
        for _ in range(args.repeats):
            runs = {}
            for backend in ("gloo", "ringcomm"):
                runs[backend] = run_client(name, backend, steps=args.steps, width=args.width,
                                           timeout=args.timeout)
                times[backend] += step_times(runs[backend], args.warmup)
            fails, loss_diff, param_diff = compare(runs["gloo"], runs["ringcomm"])
            backends = {r["backend"] for r in runs["ringcomm"]}
            if backends != {"ringcomm"}:
                fails.append(f"ran on {backends}")
            verdicts.append("DIFFER: " + fails[0] if fails else
                            "equal (exactly)" if loss_diff == param_diff == 0.0 else
                            f"close (max diff {max(loss_diff, param_diff):.1e})")
        g, rc = statistics.median(times["gloo"]) * 1e3, statistics.median(times["ringcomm"]) * 1e3
        verdict = verdicts[0] if len(set(verdicts)) == 1 else "; ".join(verdicts)
        print(f"{name:<26} {verdict:<30} {g:12.2f} {rc:16.2f} {g / rc:13.2f}")


if __name__ == "__main__":
    main()
