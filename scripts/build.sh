#!/usr/bin/env bash
# Configures (first time) and builds pipec with Ninja and ccache into build/.
#   scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${PIPEC_JOBS:-$(nproc)}
if [ ! -f build/build.ninja ]; then
  cmake -G Ninja -B build -DCMAKE_BUILD_TYPE=Release \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit "$@"
fi
start=$(date +%s)
ninja -C build -j "$JOBS"
echo "build: done in $(( $(date +%s) - start )) s"
