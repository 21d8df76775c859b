#!/usr/bin/env bash
# What a machine without the CUDA toolkit builds: the runtime, the planner
# and simulator libraries and their tests, configured with
# -DPIPEC_ENABLE_CUDA=OFF (and the compiler off, to stay quick; a full
# build without CUDA was checked by hand, README "Tests"), then their
# tests. Run by ctest as build.without_cuda:
#   scripts/check-without-cuda.sh BUILD_DIR
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir=${1:?usage: scripts/check-without-cuda.sh BUILD_DIR}
cmake -G Ninja -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
  -DPIPEC_ENABLE_CUDA=OFF -DPIPEC_ENABLE_COMPILER=OFF > "$dir.configure.log" 2>&1 ||
  { cat "$dir.configure.log"; exit 1; }
grep -q "no CUDA toolkit; the CUDA runtime is not built" "$dir.configure.log" ||
  { echo "check-without-cuda: the configuration did not leave CUDA out"; exit 1; }
ninja -C "$dir" -j "${PIPEC_JOBS:-$(nproc)}" > "$dir.build.log" 2>&1 ||
  { tail -40 "$dir.build.log"; exit 1; }
if [ -e "$dir/runtime/libpipec_rt_cuda.so" ]; then
  echo "check-without-cuda: a CUDA runtime was built"; exit 1
fi
cd "$dir"
ctest -j "${PIPEC_TEST_JOBS:-2}" --timeout 600 2>&1 | tail -3
