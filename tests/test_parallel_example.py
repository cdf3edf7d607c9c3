"""The 3D example (examples/train_3d.py) under torchrun: 4 CPU ranks, tensor x pipeline
parallel (2 x 2), a small configuration; the loss must fall and equal dense training.
Then tensor parallel 2 x ZeRO stage 3 over data parallel 2, clipping by the global norm
(--pp 1 --zero 3 --clip 0.5).
"""
import os
import re
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_3d.py")


@pytest.mark.parametrize("extra", [[], ["--pp", "1", "--zero", "3", "--clip", "0.5"]],
                         ids=["tp2_pp2", "tp2_zero3_dp2_clip"])
def test_3d_example_under_torchrun(extra):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip(f"torchrun is not installed next to {sys.executable}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    env.update(OMP_NUM_THREADS="1", RINGCOMM_TIMEOUT="30", PYTHONWARNINGS="ignore")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "4", EXAMPLE, "--tp", "2", "--pp", "2",
           "--steps", "12", "--layers", "2", "--hidden", "16", "--seq", "8", "--lr", "1e-2",
           "--check"] + extra
    # Own session: on a timeout the whole group (torchrun and its workers) is killed.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the example did not finish within 120 s:\n{stdout}\n{stderr}")
    out = stdout + stderr
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{out}"
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([0-9.]+)", stdout, re.M)]
    assert len(losses) == 12, out
    assert losses[-1] < 0.9 * losses[0], f"loss did not fall: {losses}"
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 8, f"loss is not decreasing: {losses}"
    assert "largest relative difference from dense training" in stdout, out
