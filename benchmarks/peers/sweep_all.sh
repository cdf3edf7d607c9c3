#!/usr/bin/env bash
# The issue-24 matrix: ringcomm, gloo, DeepSpeed and each MPI (its own job), world 2 and 4,
# float32 and bfloat16 SUM, all_reduce / reduce_scatter / all_gather / broadcast / reduce,
# 4 B .. 256 MiB, LAUNCHES jobs of each; JSON reports into OUT, then the summary table.
#
#   bash benchmarks/peers/sweep_all.sh PEERS_PREFIX OUT_DIR [LAUNCHES [TABLE]]
#
# TABLE defaults to OUT_DIR/../peers_table.txt (name another for another host's run).
set -euo pipefail
peers=$1; out=$2; launches=${3:-1}; table=${4:-$out/../peers_table.txt}
here=$(dirname "$0")
mkdir -p "$out"
ops=all_reduce,reduce_scatter,all_gather,broadcast,reduce
for i in $(seq 1 "$launches"); do
  for np in 2 4; do
    for mpi in impi mpich openmpi; do
      for dtype in float bfloat16; do
        # MPI reduces no bfloat16 (mpi4py has no numpy type for it): one MPI job for bfloat16.
        if [ "$dtype" = bfloat16 ] && [ "$mpi" != mpich ]; then continue; fi
        name="$mpi-np$np-$dtype-$i"
        echo "== $name $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
        timeout 1500 bash "$here/run_mpi.sh" "$peers/$mpi" "$np" --backends ringcomm,gloo,mpi,deepspeed \
          -b 4 -e 256M -f 4 -d "$dtype" --ops "$ops" --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err" \
          || echo "   $name failed: $(tail -n 3 "$out/$name.err")"
      done
    done
  done
done
python "$here/summarize.py" "$out"/*.json > "$table"
echo "table: $table"
