#!/usr/bin/env bash
# Every GPU check in one go, for a machine with a CUDA GPU (one H200 here: under
# 8 minutes): build ringcomm with CUDA (required), run the GPU tests (world size 1:
# NCCL refuses two ranks on one GPU) and a short GPU sweep of both algorithm
# families next to torch's NCCL backend.
#
#   scripts/gpu_check.sh [OUT_DIR]        (default: gpu_check_out)
#
# Writes OUT_DIR/env.txt, build.log, build_info.txt, tests.log, junit.xml,
# sweep_nccl.txt/.json, sweep_ring.txt/.json, and summary.txt. Exit status: that
# of the tests (the sweep runs either way). PYTHON picks the interpreter (it must
# have torch with CUDA; cupy and nvidia-nccl-cu12/cu13 are used when present).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

{
  nvidia-smi 2>&1 | head -15
  nvcc --version 2>&1 | tail -2
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  "$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|cupy|nvidia-nccl|pybind11|scikit-build-core|numpy) "
} > "$OUT/env.txt" 2>&1
stamp "environment: $OUT/env.txt"

# Installs (editable) into PYTHON's own environment: the GPU machines are
# throwaway, and their torch / cupy / NCCL wheel live in that environment (a
# --system-site-packages venv made from a venv would not see them). Nothing is
# downloaded. RINGCOMM_GPU_VENV=DIR builds into a fresh venv at DIR instead.
if [ -n "${RINGCOMM_GPU_VENV:-}" ]; then
  "$PY" -m venv --system-site-packages "$RINGCOMM_GPU_VENV"
  V="$RINGCOMM_GPU_VENV/bin/python"
else
  V="$PY"
fi
if ! CMAKE_ARGS="-DRINGCOMM_CUDA=ON ${CMAKE_ARGS:-}" "$V" -m pip install --no-build-isolation --no-deps -v -e . \
    > "$OUT/build.log" 2>&1; then
  stamp "BUILD FAILED (tail of $OUT/build.log follows)"
  tail -40 "$OUT/build.log"
  exit 1
fi
"$V" -c "import ringcomm; print(ringcomm.build_info()); print('nccl', ringcomm.cuda.nccl_version()); print('devices', ringcomm._C.cuda_device_count())" \
  > "$OUT/build_info.txt" 2>&1
stamp "built: $(tr '\n' ' ' < "$OUT/build_info.txt")"

timeout 300 "$V" -m pytest -q -ra -p no:cacheprovider --junitxml "$OUT/junit.xml" \
  tests/test_gpu.py tests/test_gpu_plumbing.py > "$OUT/tests.log" 2>&1
rc=$?
stamp "GPU tests: exit $rc; $(tail -1 "$OUT/tests.log")"

for algo in nccl ring; do
  RINGCOMM_GPU_ALGO=$algo timeout 120 "$V" -m ringcomm.bench.cli --nproc 1 --backends ringcomm,nccl \
    --ringcomm-device cuda --ops all_reduce,reduce_scatter,all_gather,broadcast -b 1K -e 256M -f 8 \
    --no-memcpy --json "$OUT/sweep_$algo.json" > "$OUT/sweep_$algo.txt" 2>&1
  stamp "sweep (ringcomm GPU algo $algo vs torch nccl, world size 1): exit $?, $OUT/sweep_$algo.txt"
done
stamp "done"
exit $rc
