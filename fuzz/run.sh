#!/usr/bin/env bash
# Runs every fuzz target built by fuzz/build.sh, one after the other, for RUNS
# executions or SECONDS seconds, whichever comes first (default 1,000,000 and
# 300), starting from the seed corpus; prints executions and crashes per target.
#
#   fuzz/run.sh [RUNS] [SECONDS] [OUT_DIR]
#
# New inputs go to OUT_DIR/work/<target> (the committed fuzz/corpus/<target>
# is only read); a crash leaves OUT_DIR/crash-<target>-* and the log in
# OUT_DIR/<target>.log; the exit status is non-zero if any target crashed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runs=${1:-1000000}
secs=${2:-300}
out=${3:-$here/out}
status=0
for t in frame handshake shm_header; do
  bin="$out/fuzz_$t"
  if [ ! -x "$bin" ]; then
    echo "fuzz/run.sh: $bin missing: run fuzz/build.sh first" >&2
    exit 2
  fi
  mkdir -p "$out/work/$t"
  log="$out/$t.log"
  start=$(date +%s)
  "$bin" -runs="$runs" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$out/crash-$t-" "$out/work/$t" "$here/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  crashes=$(ls "$out"/crash-"$t"-* 2>/dev/null | wc -l)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  echo "$t: ${execs:-?} executions in $(( $(date +%s) - start )) s, ${cov:-cov: ?}, exit $rc, crashes $crashes"
  [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ] && status=1
done
exit $status
