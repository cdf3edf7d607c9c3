#!/usr/bin/env bash
# Builds the fuzz targets (coverage-guided libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer) from the real parsing code, and regenerates the
# seed corpus (fuzz/corpus/, committed) with the real encoders.
#
#   fuzz/build.sh [OUT_DIR]        default fuzz/out (ignored by git)
#   fuzz/run.sh [RUNS] [SECONDS]   runs every target (see fuzz/README.md)
#
# Needs clang++ with libFuzzer (Debian: apt-get install -y clang); CXX picks
# another clang++.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=${1:-$here/out}
CXX=${CXX:-clang++}
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz/build.sh: $CXX not found (Debian: apt-get install -y clang)" >&2
  exit 1
fi
mkdir -p "$out"
common=(-std=c++17 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter
        -I"$root" -I"$root/csrc" -I"$root/csrc/include")
san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
tcp=("$root/csrc/transport/tcp/wire.cpp" "$root/csrc/transport/tcp/handshake.cpp"
     "$root/csrc/transport/tcp/socket.cpp")
shm=("$root/csrc/transport/shm/segment_header.cpp" "$root/csrc/transport/shm/segment.cpp")

build() {  # name sources...
  local name=$1
  shift
  echo "+ $CXX ... -o $out/$name"
  "$CXX" "${common[@]}" "${san[@]}" -fsanitize=fuzzer "$@" -o "$out/$name" -lrt -pthread
}
build fuzz_frame "$here/fuzz_frame.cpp" "${tcp[@]}"
build fuzz_handshake "$here/fuzz_handshake.cpp" "${tcp[@]}"
build fuzz_shm_header "$here/fuzz_shm_header.cpp" "${shm[@]}"

echo "+ $CXX ... -o $out/make_seeds"
"$CXX" "${common[@]}" "${san[@]}" "$here/make_seeds.cpp" "${tcp[@]}" -o "$out/make_seeds" -lrt -pthread
rm -rf "$here/corpus"
"$out/make_seeds" "$here/corpus"
for t in frame handshake shm_header; do
  echo "seed corpus $t: $(ls "$here/corpus/$t" | wc -l) files"
done
