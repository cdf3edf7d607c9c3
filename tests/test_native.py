"""The native unit tests (tests/native/: schedule arithmetic, plan_call's
schedules for worlds 1..5, the TCP wire and shared-memory header parsers).

They are built with the package (scikit-build-core builds every target into
pyproject's build-dir, build/{wheel_tag}; they are not installed) and run
here through CTest in that directory. Where there is no such directory (an
installed wheel built elsewhere), they are configured and built alone, CPU
only and without the Python modules, into a temporary directory (with
cmake from PATH or beside this interpreter). CTest may be absent where the package was
built in an isolated environment: the test binary is then run the way
tests/native/CMakeLists.txt registers it.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GROUPS = ("blocks", "plan_call", "flat_shape", "wire", "shm_header", "shm_departure", "text")
EXE = "ringcomm_native_tests"


def tool(name):
    """cmake / ctest on PATH or beside this interpreter (the cmake wheel)."""
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))


def wheel_build_dir():
    """The newest build/<wheel tag> of this Python version holding the native tests' binary."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}-"
    found = [d for d in (ROOT / "build").glob(f"{tag}*") if (d / "tests" / "native" / EXE).is_file()]
    return max(found, key=lambda d: (d / "tests" / "native" / EXE).stat().st_mtime) if found else None


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    d = wheel_build_dir()
    if d is not None:
        return d
    cmake = tool("cmake")
    assert cmake, "no build/<wheel tag> with the native tests and no cmake to build them"
    d = tmp_path_factory.mktemp("native-build")
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    for cmd, limit in (([cmake, "-S", str(ROOT), "-B", str(d), "-DRINGCOMM_CUDA=OFF", "-DRINGCOMM_MODULES=OFF",
                         "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}"], 300),
                       ([cmake, "--build", str(d), "--target", EXE], 1200)):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
        assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout[-4000:]}{r.stderr[-4000:]}"
    return d


def test_native_unit_tests_pass(build_dir):
    ctest = tool("ctest")
    if ctest:
        r = subprocess.run([ctest, "--output-on-failure", "--timeout", "120"], cwd=build_dir,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
        for g in GROUPS + ("selftest_fails",):
            assert f"native_{g} " in r.stdout, r.stdout
        assert "100% tests passed" in r.stdout, r.stdout
    else:
        for g in GROUPS:
            r = subprocess.run([str(build_dir / "tests" / "native" / EXE), g], capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_a_broken_expectation_fails_the_run(build_dir):
    """The runner's own check: its selftest group holds one check that does not hold."""
    r = subprocess.run([str(build_dir / "tests" / "native" / EXE), "selftest"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, r.stdout
    assert "CHECK failed: 1 + 1 == 3: 2 != 3" in r.stderr, r.stderr
    assert "FAIL selftest.a_broken_expectation_fails" in r.stdout, r.stdout
    r = subprocess.run([str(build_dir / "tests" / "native" / EXE), "no_such_group"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "no test in the groups named" in r.stderr
