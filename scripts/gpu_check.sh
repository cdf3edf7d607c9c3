#!/usr/bin/env bash
# Every GPU check in one go, for a machine with a CUDA GPU (one H200 lent for ~15
# minutes, 10 minutes a command, 8 files back): build ringcomm with CUDA, say what
# the run stands on (CUDA runtime and driver, torch's CUDA and NCCL, which libnccl
# was loaded), run the GPU tests (tests/test_gpu.py: kernels, every primitive,
# streams, graphs, and issue 13's watchdog abort, close with a tensor in flight and
# capture beside a pending op; test_gpu_plumbing.py) and the checks world size 1
# otherwise never reaches (tests/test_gpu_checks.py: NCCL self send/recv, the ring
# family in a graph, counts above 2**31, mixed alignments with NaN), the cuda_ipc
# transport with 2, 3 and 4 ranks sharing the one GPU (tests/test_gpu_ipc.py: every
# primitive x dtype x op against numpy, one-shot / two-shot / ring bit-identical on
# every rank, graph capture refused, an abort reaching a spinning wait kernel; and
# tests/test_torch_backend_cuda.py: CUDA tensors through the torch backend, 1 and 2
# ranks, stream semantics), its
# figures (scripts/ipc_bench.py: the reduction kernels' throughput against the
# device-to-device copy of the same run, target 85%; one-shot all_reduce latency
# 8 B..256 KiB next to NCCL at world size 1 and the ring over cuda_ipc), optionally
# compute-sanitizer on the kernel test, and end with a short sweep against torch's
# NCCL backend.
#
#   scripts/gpu_check.sh [--quick] [--no-build] [--no-sanitizer] [--budget SECONDS] [OUT_DIR]
#
# OUT_DIR (default gpu_check_out) gets exactly two files: summary.txt (one screen,
# its first line "RESULT: PASS" or "RESULT: FAIL ...") and gpu_check.tar.gz (every
# log, JUnit report and sweep table, the summary too). The archive is rewritten
# after every step, so a run killed from outside still leaves what it had.
#
# Time: every step runs under `timeout` (SIGABRT first, so PYTHONFAULTHANDLER
# prints the hung Python stacks into the step's log, then SIGKILL), each with its
# own cap and never past the budget (default 450 s, --quick 240 s, at most 470 s:
# under 8 minutes even when every step hangs). Pytest runs -v -rA --durations=15,
# with --timeout per test when pytest-timeout is installed.
#
# On a lent machine (the device tool's run): `scripts/gpu_check.sh $OUT` with a
# timeout_s of about 540, and `--quick` for a rerun in the time left.
#
# Exit status: 0 only when a GPU was found and every step passed; 1 otherwise
# (no GPU, a skipped GPU test, a failure, a step timed out or not run for lack of
# time); 2 for bad arguments. PYTHON picks the interpreter (it must have torch
# with CUDA; cupy and nvidia-nccl-cu12/cu13 are used when present).
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/gpu_check.sh [--quick] [--no-build] [--no-sanitizer] [--budget SECONDS] [OUT_DIR]

  OUT_DIR          where summary.txt and gpu_check.tar.gz go (default gpu_check_out)
  --quick          shorter caps, no compute-sanitizer, one sweep (a rerun in the time left)
  --no-build       test the ringcomm already installed in PYTHON's environment
  --no-sanitizer   leave compute-sanitizer out
  --budget S       the whole run's time limit in seconds (20..470; default 450, --quick 240)
  -h, --help       this text
EOF
}
bad_usage() {
  echo "gpu_check.sh: $*" >&2
  usage >&2
  exit 2
}

QUICK=0 BUILD=1 SANITIZER=1 BUDGET="" OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --quick) QUICK=1 ;;
    --no-build) BUILD=0 ;;
    --no-sanitizer) SANITIZER=0 ;;
    --budget) [ $# -ge 2 ] || bad_usage "--budget needs a number of seconds"; BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    --) shift; [ $# -le 1 ] || bad_usage "one OUT_DIR at most"; OUT=${1:-}; break ;;
    -*) bad_usage "unknown option $1" ;;
    *) [ -z "$OUT" ] || bad_usage "one OUT_DIR at most (got '$OUT' and '$1')"; OUT=$1 ;;
  esac
  shift
done
if [ -z "$BUDGET" ]; then
  BUDGET=$([ $QUICK = 1 ] && echo 240 || echo 450)
fi
[[ "$BUDGET" =~ ^[0-9]+$ ]] || bad_usage "--budget must be a whole number of seconds, got '$BUDGET'"
{ [ "$BUDGET" -ge 20 ] && [ "$BUDGET" -le 470 ]; } || bad_usage "--budget must be between 20 and 470 s, got $BUDGET"
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT" || bad_usage "cannot create OUT_DIR '$OUT'"
OUT=$(cd "$OUT" && pwd)

T0=$(date +%s)
DEADLINE=$((T0 + BUDGET))
RESERVE=8  # seconds kept for the summary and the archive
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
PY=${PYTHON:-python3}
WORKROOT=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 1
W=$WORKROOT/gpu_check
mkdir -p "$W"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
ulimit -c 0 2>/dev/null  # SIGABRT at a time limit must not write cores

: > "$W/steps.txt"
: > "$W/problems.txt"
FACTS=""   # a few lines of what the run stands on, for the summary
GPU=0      # a GPU was found
BUILT=1    # the build (or the installed one) is usable

elapsed() { echo $(( $(date +%s) - T0 )); }
# note STATUS STEP DETAIL...: one line of the summary's step table. FAIL lines are
# also problems, INFO and SKIP lines are not.
note() {
  local status=$1 step=$2; shift 2
  printf '[%3d s] %-5s %-18s %s\n' "$(elapsed)" "$status" "$step" "$*" >> "$W/steps.txt"
  [ "$status" != FAIL ] || echo "$step: $*" >> "$W/problems.txt"
  echo "gpu_check: $status $step $*"
}
# The archive goes first and summary.txt last, each written aside and renamed into
# place: whatever summary.txt says, the archive beside it is at least that far on,
# even for a run killed between the two.
archive() {
  tar -C "$WORKROOT" -czf "$OUT/gpu_check.tar.gz.part" gpu_check 2>/dev/null &&
    mv -f "$OUT/gpu_check.tar.gz.part" "$OUT/gpu_check.tar.gz"
  cp "$W/summary.txt" "$OUT/summary.txt.part" 2>/dev/null && mv -f "$OUT/summary.txt.part" "$OUT/summary.txt"
}
# write_summary [RUNNING]: RUNNING names the step under way for the summaries
# written before each step, so that a run killed from outside never leaves one
# that reads as a pass.
write_summary() {
  local n result running=${1:-}
  n=$(wc -l < "$W/problems.txt")
  if [ -n "$running" ]; then
    result="RESULT: FAIL (incomplete: the run stopped during $running; $n problem$([ "$n" = 1 ] || echo s) before it)"
  elif [ "$n" -eq 0 ] && [ $GPU = 1 ]; then
    result="RESULT: PASS"
  else
    result="RESULT: FAIL ($n problem$([ "$n" = 1 ] || echo s)$([ $GPU = 1 ] || echo '; NO GPU FOUND'))"
  fi
  {
    echo "$result"
    echo "ringcomm GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed) s of a $BUDGET s budget$([ $QUICK = 1 ] && echo ', --quick')"
    if git -C "$REPO" rev-parse --short HEAD > /dev/null 2>&1; then
      echo "commit: $(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
    fi
    [ -z "$FACTS" ] || printf '%s\n' "$FACTS"
    echo
    cat "$W/steps.txt"
    if [ "$n" -gt 0 ]; then
      echo
      echo "problems:"
      sed 's/^/  - /' "$W/problems.txt"
    fi
    echo
    echo "everything: $OUT/gpu_check.tar.gz (gpu_check/*.log, *.xml, sweep_*)"
  } > "$W/summary.txt"
}
finish() {
  write_summary
  archive
  cat "$W/summary.txt"
  rm -rf "$WORKROOT"
  [ "$(head -1 "$OUT/summary.txt")" = "RESULT: PASS" ] && exit 0
  exit 1
}
trap 'note FAIL script "stopped by a signal"; finish' TERM INT HUP

# run_step LOG CAP KEEP CMD...: CMD under `timeout`, output to $W/LOG, for at most
# CAP seconds and never into the last KEEP (+ RESERVE) seconds of the budget. Sets
# RC (124: timed out, 125: not run, no time left) and TOOK.
run_step() {
  local log=$1 cap=$2 keep=$3; shift 3
  local left=$(( DEADLINE - $(date +%s) - RESERVE ))
  # What is kept for later steps never takes more than half of what is left.
  [ $(( keep * 2 )) -le "$left" ] || keep=$(( left / 2 ))
  left=$(( left - keep ))
  local limit=$(( cap < left ? cap : left ))
  TOOK=0
  if [ "$limit" -lt 10 ]; then
    echo "not run: $left s left of the budget" > "$W/$log"
    RC=125
    return
  fi
  local t=$(date +%s)
  echo "\$ $*   (limit $limit s)" > "$W/$log"
  write_summary "$log"
  archive
  timeout -s ABRT -k 5 "$limit" "$@" >> "$W/$log" 2>&1 < /dev/null
  RC=$?
  TOOK=$(( $(date +%s) - t ))
  [ $RC -ne 137 ] || RC=124
  echo "[exit $RC after $TOOK s, limit $limit s]" >> "$W/$log"
}
# why_not NAME: the summary text for RC 124 / 125 / other.
why_not() {
  case $RC in
    124) echo "TIMED OUT after $TOOK s (stacks in $1)" ;;
    125) echo "not run: out of time" ;;
    *) echo "exit $RC (see $1)" ;;
  esac
}

# ---- the machine, before anything is built ------------------------------------
# (Each command here and between the steps has a limit of its own; the steps
# after them start from what is left of the budget.)
{
  echo "== nvidia-smi"; timeout 20 nvidia-smi 2>&1 | head -20
  echo "== nvidia-smi --query-gpu"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1
  echo "== nvcc"; timeout 20 nvcc --version 2>&1 | tail -2
  echo "== compute-sanitizer"; command -v compute-sanitizer 2>&1 || echo "(not on PATH)"
  echo "== $PY"; timeout 60 "$PY" -m pip list 2>/dev/null |
    grep -i -E "^(torch|cupy|nvidia-nccl|pybind11|scikit-build-core|numpy|pytest|pytest-timeout|cmake|ninja) "
  echo "== CPU"; grep -m1 "model name" /proc/cpuinfo; nproc
} > "$W/machine.txt" 2>&1
SMI=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
note INFO machine "nvidia-smi: ${SMI:-none (no driver / no GPU)}"

# ---- build --------------------------------------------------------------------
# Into PYTHON's own environment (editable): the GPU machines are throwaway and
# their torch / cupy / NCCL live there. RINGCOMM_GPU_VENV=DIR builds into a fresh
# --system-site-packages venv at DIR instead. Nothing is downloaded.
V=$PY
# The nccl.h of PYTHON's nvidia-nccl wheel, if any: the build checks ringcomm's
# NCCL declarations against it, and test_gpu_plumbing checks that it did.
DESELECT=()
if [ -z "${NCCL_HOME:-}" ] && [ $BUILD = 1 ]; then
  NCCL_WHEEL=$(timeout 30 "$PY" -c "import importlib.util as u, os; s = u.find_spec('nvidia.nccl'); print(next((p for p in (s.submodule_search_locations if s else []) if os.path.exists(os.path.join(p, 'include', 'nccl.h'))), ''))" 2>/dev/null)
  [ -z "$NCCL_WHEEL" ] || export NCCL_HOME=$NCCL_WHEEL
fi
if [ -z "${NCCL_HOME:-}" ] || [ $BUILD = 0 ]; then
  DESELECT=(--deselect tests/test_gpu_plumbing.py::test_nccl_declarations_were_checked_against_nccl_h)
fi
if [ $BUILD = 1 ]; then
  if [ -n "${RINGCOMM_GPU_VENV:-}" ]; then
    "$PY" -m venv --system-site-packages "$RINGCOMM_GPU_VENV" && V="$RINGCOMM_GPU_VENV/bin/python"
  fi
  CMAKE_ARGS="-DRINGCOMM_CUDA=ON ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    run_step build.log "$([ $QUICK = 1 ] && echo 200 || echo 240)" 120 \
    "$V" -m pip install --no-build-isolation --no-deps -v -e .
  if [ $RC -eq 0 ]; then
    note OK build "$TOOK s (build.log)"
  else
    note FAIL build "$(why_not build.log); the tests below would test a stale build and are not run"
    BUILT=0
  fi
else
  note SKIP build "--no-build: the ringcomm installed for $V"
fi

# ---- what the run stands on -----------------------------------------------------
run_step env.txt 60 60 "$V" scripts/gpu_env.py
GPU_LINE=$(grep '^GPU_FOUND=' "$W/env.txt" | tail -1)
pick() { grep -m1 "^$1" "$W/env.txt" | cut -d: -f2- | sed 's/^ *//' | grep . || echo "-"; }
FACTS=$(cut -c1-200 <<EOF
gpu: $(pick 'torch devices')
cuda: $(grep -m1 'CUDA runtime (linked' "$W/env.txt" | sed 's/^ *//')
torch: $(pick 'torch:') cuda $(pick 'torch CUDA (built') nccl $(pick 'torch NCCL')
ringcomm nccl: $(pick 'ringcomm NCCL')
libnccl loaded: $(sed -n '/^libnccl mapped/,/^GPU_FOUND/p' "$W/env.txt" | grep '^  ' | sed 's/^ *//' | paste -sd' ' -)
EOF
)
if [ "${GPU_LINE#GPU_FOUND=1}" != "$GPU_LINE" ]; then
  GPU=1
  note OK gpu "${GPU_LINE#GPU_FOUND=1 }"
elif [ -n "$GPU_LINE" ]; then
  note FAIL gpu "NO GPU FOUND: ${GPU_LINE#GPU_FOUND=0 }"
else
  note FAIL gpu "NO GPU FOUND: scripts/gpu_env.py gave no verdict ($(why_not env.txt))"
fi

# ---- the GPU tests ------------------------------------------------------------
# They run without a GPU too (and then skip, which fails the check): the summary
# shows what was skipped and why.
PYTEST=("$V" -m pytest -v -rA --durations=15 -p no:cacheprovider)
if timeout 30 "$V" -c "import pytest_timeout" 2>/dev/null; then
  PYTEST+=(--timeout "$([ $QUICK = 1 ] && echo 90 || echo 150)" --timeout-method thread)
  PER_TEST="pytest-timeout per test"
else
  PER_TEST="no pytest-timeout: the step's limit and the tests' own child timeouts"
fi
note INFO limits "$PER_TEST"
[ ${#DESELECT[@]} -eq 0 ] || note INFO nccl.h "none to build against (or --no-build): the nccl.h check is left out"
# pytest_step NAME CAP KEEP FILES...
pytest_step() {
  local name=$1 cap=$2 keep=$3; shift 3
  if [ $BUILT = 0 ]; then
    note FAIL "$name" "not run: the build failed"
    return
  fi
  run_step "$name.log" "$cap" "$keep" "${PYTEST[@]}" --junitxml "$W/$name.xml" "$@"
  local report
  if [ $RC -eq 124 ] || [ $RC -eq 125 ]; then
    note FAIL "$name" "$(why_not "$name.log")"
    return
  fi
  report=$(timeout 30 "$V" scripts/gpu_check_report.py --show 2 "$W/$name.xml" 2>&1)
  if [ $? -eq 0 ] && [ $RC -eq 0 ]; then
    note OK "$name" "$(head -1 <<< "$report")"
  else
    note FAIL "$name" "pytest exit $RC: $(head -1 <<< "$report")"
    tail -n +2 <<< "$report" | sed 's/^/                                    /' >> "$W/steps.txt"
  fi
}
SWEEP_NEED=$([ $GPU = 0 ] && echo 0 || { [ $QUICK = 1 ] && echo 40 || echo 100; })
IPC_NEED=$([ $GPU = 0 ] && echo 0 || { [ $QUICK = 1 ] && echo 80 || echo 140; })
pytest_step gpu_tests "$([ $QUICK = 1 ] && echo 100 || echo 150)" $((SWEEP_NEED + IPC_NEED + 60)) \
  tests/test_gpu.py tests/test_gpu_plumbing.py "${DESELECT[@]}"
pytest_step gpu_checks "$([ $QUICK = 1 ] && echo 100 || echo 150)" $((SWEEP_NEED + IPC_NEED)) tests/test_gpu_checks.py

# ---- cuda_ipc: ranks sharing the one GPU, then its figures ---------------------------
pytest_step gpu_ipc "$([ $QUICK = 1 ] && echo 100 || echo 160)" $((SWEEP_NEED + IPC_NEED / 3)) tests/test_gpu_ipc.py \
  tests/test_torch_backend_cuda.py
if [ $GPU = 0 ] || [ $BUILT = 0 ]; then
  note SKIP ipc_bench "no GPU / no build"
else
  run_step ipc_bench.txt "$([ $QUICK = 1 ] && echo 50 || echo 80)" "$SWEEP_NEED" \
    "$V" scripts/ipc_bench.py $([ $QUICK = 1 ] && echo --quick) --json "$W/ipc_bench.json"
  line=$(grep '^IPC_BENCH: ' "$W/ipc_bench.txt" | tail -1)
  if [ $RC -eq 0 ] && [ "${line#IPC_BENCH: OK }" != "$line" ]; then
    note OK ipc_bench "${line#IPC_BENCH: OK }"
  elif [ -n "$line" ] && [ $RC -ne 124 ]; then
    note FAIL ipc_bench "${line#IPC_BENCH: FAIL }"
  else
    note FAIL ipc_bench "$(why_not ipc_bench.txt)"
  fi
fi

# ---- optional: compute-sanitizer on the kernel test ---------------------------------
if [ $QUICK = 1 ] || [ $SANITIZER = 0 ]; then
  note SKIP sanitizer "left out ($([ $QUICK = 1 ] && echo --quick || echo --no-sanitizer))"
elif [ $GPU = 0 ] || [ $BUILT = 0 ]; then
  note SKIP sanitizer "no GPU / no build"
elif ! command -v compute-sanitizer > /dev/null; then
  note SKIP sanitizer "compute-sanitizer is not on PATH"
else
  run_step sanitizer.log 90 "$SWEEP_NEED" compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$V" -m pytest -q -p no:cacheprovider tests/test_gpu.py -k test_cuda_kernels_match_cpu_kernels
  if [ $RC -eq 0 ] && grep -q " passed" "$W/sanitizer.log"; then
    note OK sanitizer "memcheck clean: $(grep -m1 'ERROR SUMMARY' "$W/sanitizer.log")"
  elif [ $RC -eq 9 ] || grep -q "ERROR SUMMARY: [1-9]" "$W/sanitizer.log"; then
    note FAIL sanitizer "memcheck found errors: $(grep -m1 'ERROR SUMMARY' "$W/sanitizer.log") (sanitizer.log)"
  else
    note INFO sanitizer "optional, not counted: $(why_not sanitizer.log); $(grep -v '^\[exit' "$W/sanitizer.log" | tail -1 | cut -c1-120)"
  fi
fi

# ---- the short sweep against torch's NCCL backend, last ------------------------------
if [ $GPU = 0 ] || [ $BUILT = 0 ]; then
  note SKIP sweep "no GPU / no build"
else
  if [ $QUICK = 1 ]; then ALGOS="ring"; EMAX=64M; CAP=40; else ALGOS="nccl ring"; EMAX=256M; CAP=50; fi
  KEEP=$(( $(wc -w <<< "$ALGOS") > 1 ? CAP : 0 ))  # the first sweep leaves the second its share
  for algo in $ALGOS; do
    RINGCOMM_GPU_ALGO=$algo run_step "sweep_$algo.txt" "$CAP" "$KEEP" "$V" -m ringcomm.bench.cli --nproc 1 \
      --backends ringcomm,nccl --ringcomm-device cuda --ops all_reduce,reduce_scatter,all_gather,broadcast \
      -b 1K -e "$EMAX" -f 8 --budget 0.05 --no-memcpy --json "$W/sweep_$algo.json"
    if [ $RC -eq 0 ]; then
      report=$(timeout 30 "$V" scripts/gpu_check_report.py --sweep "$W/sweep_$algo.txt" 2>&1)
      if [ $? -eq 0 ]; then
        note OK "sweep $algo" "$report"
      else
        note FAIL "sweep $algo" "$report (sweep_$algo.txt)"
      fi
    else
      note FAIL "sweep $algo" "$(why_not "sweep_$algo.txt")"
    fi
    KEEP=0
  done
fi
finish
