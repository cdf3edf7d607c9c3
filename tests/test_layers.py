"""The native core's layering (csrc/check_layers.py, run by the build before
any layer compiles): the real tree keeps the rules, and a planted upward
include, an include of a layer that is not a dependency, a CPU file that
includes a CUDA part, and a file in no layer each fail the check with the
file, the line and the rule. Also: the production module carries no test
hook, ringcomm._C_testing carries them all, and the package ships no testing
aid.
"""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT / "csrc" / "check_layers.py"

# What ringcomm._C_testing registers (csrc/testing/bind_*.cpp).
HOOKS = ["_simulate_device_call", "_FaultRecord", "_AbortGate", "_abort_gate_race",
         "_IpcHostComm", "_ipc_buffer_bytes", "check_plan", "PlanCacheChecker"]


def run_checker(csrc):
    return subprocess.run([sys.executable, str(CHECKER), str(csrc)], capture_output=True, text=True, timeout=60)


@pytest.fixture
def tree(tmp_path):
    copy = tmp_path / "csrc"
    shutil.copytree(ROOT / "csrc", copy)
    return copy


def plant(path, include, after="#pragma once\n"):
    """Adds `#include "include"` to `path`; returns its line number."""
    s = path.read_text()
    if after and after in s:
        head, tail = s.split(after, 1)
        head += after
    else:
        head, tail = "", s
    path.write_text(head + f'#include "{include}"\n' + tail)
    return head.count("\n") + 1


def test_the_real_tree_keeps_the_rules():
    r = run_checker(ROOT / "csrc")
    assert r.returncode == 0, r.stderr


def test_the_copy_passes_before_planting(tree):
    assert run_checker(tree).returncode == 0


@pytest.mark.parametrize("file,include,rule", [
    # The upward include this layering removed: the schedules' steps reaching into the transports.
    ("algo/step.h", "transport/link.h", "layer algo may include only algo, common"),
    ("algo/ring.cpp", "comm/describe.h", "layer algo may include only algo, common"),
    ("reduce/cpu/dispatch.cpp", "transport/link.h", "layer reduce may include only common, reduce"),
    ("common/types.cpp", "ringcomm/reducer.h", "layer common may include only common,"),
    ("transport/tcp/wire.cpp", "comm/communicator.h", "layer transport may include"),
    ("comm/executor.cpp", "bindings/bind.h", "layer comm may include"),
    ("bindings/bind_types.cpp", "testing/plan_check.h", "layer bindings may include"),
    # A CPU part including a CUDA part would break the build without CUDA.
    ("transport/router.cpp", "transport/nccl/nccl_comm.h", "layer transport may include"),
    ("comm/communicator.cpp", "comm/cuda/gpu_communicator.h", "layer comm may include"),
])
def test_a_planted_include_fails_naming_file_line_and_rule(tree, file, include, rule):
    line = plant(tree / file, include)
    r = run_checker(tree)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f'csrc/{file}:{line}: #include "{include}"' in r.stderr, r.stderr
    assert rule in r.stderr, r.stderr
    assert "above it, or not among its dependencies" in r.stderr


def test_a_file_in_no_layer_and_an_include_of_nothing_fail(tree):
    # Spelled in pieces: these paths exist only in the planted copy (scripts/check_paths.py).
    stray, missing = "/".join(("stray", "x.cpp")), "/".join(("comm", "no_such_header.h"))
    (tree / "stray").mkdir()
    (tree / stray).write_text("int x;\n")
    plant(tree / "comm" / "work.cpp", missing, after="")
    r = run_checker(tree)
    assert r.returncode == 1
    assert f"csrc/{stray}:1: the file is in no layer" in r.stderr, r.stderr
    assert f'csrc/comm/work.cpp:1: #include "{missing}" names no file of csrc/' in r.stderr, r.stderr


def test_the_build_runs_the_check():
    """csrc/CMakeLists.txt runs the checker at configure time and as a step every layer waits for."""
    cmake = (ROOT / "csrc" / "CMakeLists.txt").read_text()
    assert "check_layers.py" in cmake
    assert "add_dependencies(${target} ringcomm_layer_check)" in cmake


def cmake():
    return shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(cmake() is None, reason="needs cmake (the build's own ran in its isolated environment)")
def test_configure_fails_on_an_upward_include(tree, tmp_path):
    """The same planted include stops a configure of the layers' build."""
    plant(tree / "algo" / "step.h", "transport/link.h")
    src = tree.parent
    (src / "CMakeLists.txt").write_text((ROOT / "CMakeLists.txt").read_text())
    shutil.copytree(ROOT / "tests" / "native", src / "tests" / "native")
    r = subprocess.run([cmake(), "-S", str(src), "-B", str(tmp_path / "build"), "-DRINGCOMM_CUDA=OFF",
                        "-DRINGCOMM_MODULES=OFF", f"-DPython_EXECUTABLE={sys.executable}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stdout
    assert 'csrc/algo/step.h:' in r.stderr and "layer algo may include only algo, common" in r.stderr, r.stderr
    assert "a layer includes a header of a layer above it" in r.stderr, r.stderr


def test_production_module_has_no_test_hooks():
    import ringcomm
    import ringcomm._C_testing as t
    present = [h for h in HOOKS if hasattr(ringcomm._C, h)]
    assert not present, f"test hooks in ringcomm._C: {present}"
    missing = [h for h in HOOKS if not hasattr(t, h)]
    assert not missing, f"missing from ringcomm._C_testing: {missing}"
    assert hasattr(ringcomm._C.Communicator, "plan_cache_stats")  # production, stays in _C


def test_the_package_never_imports_the_hooks_nor_ships_the_standin():
    pkg = ROOT / "python" / "ringcomm"
    users = [str(p.relative_to(ROOT)) for p in pkg.rglob("*.py") if "_C_testing" in p.read_text()]
    assert not users, users
    assert not (pkg / "torch_backend" / "standin.py").exists()
    assert importlib.util.find_spec("ringcomm.torch_backend.standin") is None
