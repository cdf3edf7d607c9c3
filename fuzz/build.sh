#!/usr/bin/env bash
# Builds the fuzz targets (coverage-guided libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer) from the same layer libraries as the module
# (fuzz/CMakeLists.txt on csrc/CMakeLists.txt: the transport layer and those
# below it, compiled with the sanitizers), and regenerates the seed corpus
# (fuzz/corpus/, committed) with the real encoders.
#
#   fuzz/build.sh [OUT_DIR]        default fuzz/out (ignored by git); CMake builds in OUT_DIR/build
#   fuzz/run.sh [RUNS] [SECONDS]   runs every target (see fuzz/README.md)
#
# Needs clang++ with libFuzzer (Debian: apt-get install -y clang) and cmake;
# CXX picks another clang++.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/out}
CXX=${CXX:-clang++}
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz/build.sh: $CXX not found (Debian: apt-get install -y clang)" >&2
  exit 1
fi
if ! command -v cmake >/dev/null; then
  echo "fuzz/build.sh: cmake not found" >&2
  exit 1
fi
mkdir -p "$out"
gen=()
if command -v ninja >/dev/null; then gen=(-G Ninja); fi
echo "+ cmake -S $here -B $out/build -DCMAKE_CXX_COMPILER=$CXX"
cmake -S "$here" -B "$out/build" "${gen[@]}" -DCMAKE_CXX_COMPILER="$(command -v "$CXX")" \
  -DPython_EXECUTABLE="$(command -v python3)" >"$out/cmake.log" ||
  { cat "$out/cmake.log" >&2; exit 1; }
cmake --build "$out/build" --parallel "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  --target fuzz_frame fuzz_handshake fuzz_shm_header make_seeds
for t in fuzz_frame fuzz_handshake fuzz_shm_header make_seeds; do
  cp "$out/build/$t" "$out/$t"
done
rm -rf "$here/corpus"
"$out/make_seeds" "$here/corpus"
for t in frame handshake shm_header; do
  echo "seed corpus $t: $(ls "$here/corpus/$t" | wc -l) files"
done
