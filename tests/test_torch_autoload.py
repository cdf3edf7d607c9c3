"""The "torch.backends" entry point: init_process_group("ringcomm") with no import of ringcomm.

torch runs the entry points of that group inside `import torch`; ringcomm's
(_ringcomm_autoload) must register the name, import nothing of ringcomm until a
group is made, and never make `import torch` fail. Each check runs in a fresh
interpreter (the pytest process imported torch long ago) that prints its
failures, one per line, then "done".
"""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import harness


def _python(script, env_extra=None, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("done"), \
        f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    fails = r.stdout.rstrip().splitlines()[:-1]
    assert not fails, "\n".join(fails)


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="torch.backends") if ep.name == "ringcomm"]
    assert [ep.value for ep in eps] == ["_ringcomm_autoload:_autoload"], (
        f"ringcomm's torch.backends entry point is {[ep.value for ep in eps]}: "
        "reinstall ringcomm (pip install .) so that its metadata has it")


def test_import_torch_registers_without_importing_ringcomm():
    _python("""
        import sys, torch, torch.distributed as dist
        fails = []
        def check(ok, what):
            if not ok:
                fails.append(what)
        loaded = sorted(m for m in sys.modules if m == "ringcomm" or m.startswith("ringcomm."))
        check("_ringcomm_autoload" in sys.modules, "the entry point did not run")
        check(not loaded, f"import torch imported {loaded}: the hook must stay lazy")
        check("ringcomm" in dist.Backend.backend_list, f"not registered: {dist.Backend.backend_list}")
        check(dist.Backend.default_device_backend_map["cpu"] == "gloo", "ringcomm must not take over cpu")
        dist.init_process_group("ringcomm", store=dist.HashStore(), rank=0, world_size=1)
        check(dist.get_backend() == "ringcomm", f"backend {dist.get_backend()}")
        check(type(dist.group.WORLD).__name__ == "ProcessGroupRingcomm", f"group {type(dist.group.WORLD)}")
        x = torch.arange(4.0)
        dist.all_reduce(x)
        out = torch.empty(4)
        dist.all_gather_into_tensor(out, x)
        dist.all_reduce(x, async_op=True).get_future().wait()
        check(torch.equal(out, torch.arange(4.0)), f"all_gather gave {out}")
        import ringcomm.torch_backend  # an explicit import after the hook only registers again
        sub = dist.new_group([0])
        y = torch.ones(2)
        dist.all_reduce(y, group=sub)
        check(dist.get_backend(sub) == "ringcomm" and y.tolist() == [1.0, 1.0], "new_group after the import")
        dist.destroy_process_group()
        print("\\n".join(fails + ["done"]))
    """)


def test_autoload_off_and_a_broken_install_leave_import_torch_working():
    """TORCH_DEVICE_BACKEND_AUTOLOAD=0 leaves the name unregistered (the explicit
    import still works); a ringcomm that cannot be imported, or a torch whose
    registration raises, must not break `import torch`: the error comes when a
    ringcomm group is made, naming what failed."""
    _python("""
        import sys, torch, torch.distributed as dist
        fails = []
        if "ringcomm" in dist.Backend.backend_list or "_ringcomm_autoload" in sys.modules:
            fails.append("TORCH_DEVICE_BACKEND_AUTOLOAD=0 still ran the hook")
        try:
            dist.init_process_group("ringcomm", store=dist.HashStore(), rank=0, world_size=1)
            fails.append("init_process_group('ringcomm') worked with the name unregistered")
        except Exception as e:
            if "ringcomm" not in str(e).lower():
                fails.append(f"unregistered name: the error does not name it: {e!r}")
        import _ringcomm_autoload
        real = dist.Backend.register_backend
        def broken(*a, **k):
            raise RuntimeError("registration refused")
        dist.Backend.register_backend = broken
        try:
            _ringcomm_autoload._autoload()
        except Exception as e:
            fails.append(f"the hook raised: {e!r}")
        dist.Backend.register_backend = real
        import ringcomm.torch_backend
        dist.init_process_group("ringcomm", store=dist.HashStore(), rank=0, world_size=1)
        if dist.get_backend() != "ringcomm":
            fails.append("the explicit import did not register")
        dist.destroy_process_group()
        print("\\n".join(fails + ["done"]))
    """, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    _python("""
        import sys
        sys.modules["ringcomm"] = None  # ringcomm cannot be imported (as a broken build)
        import torch, torch.distributed as dist
        fails = []
        if "ringcomm" not in dist.Backend.backend_list:
            fails.append("the hook did not register the name")
        try:
            dist.init_process_group("ringcomm", store=dist.HashStore(), rank=0, world_size=1)
            fails.append("a group was made without ringcomm")
        except ImportError as e:
            if "ringcomm" not in str(e):
                fails.append(f"the error does not name ringcomm: {e!r}")
        print("\\n".join(fails + ["done"]))
    """)


_TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist

dist.init_process_group("ringcomm")  # no import of ringcomm: torch's entry point registered it
assert type(dist.group.WORLD).__name__ == "ProcessGroupRingcomm", type(dist.group.WORLD)
rank, ws = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(3, 4)).sum().backward()
grads = [torch.empty_like(model.module.weight.grad) for _ in range(ws)]
dist.all_gather(grads, model.module.weight.grad)
assert all(torch.equal(g, grads[0]) for g in grads)
dist.destroy_process_group()
print(f"rank {rank} of {ws} ok")
"""


def test_torchrun_without_import(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TORCHRUN_SCRIPT)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc-per-node", "2", "--master-port", str(harness.free_port()), str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        # torchrun puts each worker in a session of its own: SIGTERM makes it stop them.
        os.kill(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=20)
        pytest.fail(f"torchrun did not finish within 120 s:\n{out[-3000:]}")
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}:\n{out[-3000:]}"
    assert "rank 0 of 2 ok" in out and "rank 1 of 2 ok" in out, out[-3000:]
