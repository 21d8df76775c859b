#!/usr/bin/env bash
# Builds the libFuzzer target of the ONNX importer with clang-14 (ASan +
# libFuzzer) against an existing build/ and runs it for a while:
#   scripts/fuzz-importer.sh [SECONDS] [extra libFuzzer args]
# The corpus starts from ONNX's operator test models and the examples; it
# is not part of CI (minutes, not seconds). Crashes land in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-120}
shift || true
CXX=${CXX_FUZZ:-clang++-14}
OUT=build-fuzz
mkdir -p "$OUT/corpus"
[ -f build/lib/libPipecNN.a ] || { echo "build pipec first (scripts/build.sh)"; exit 1; }
INC="-Iinclude -I. -Ibuild -isystem /usr/lib/llvm-22/include"
DEFS="-DONNX_NAMESPACE=onnx -DONNX_ML=1 -D_GNU_SOURCE -D__STDC_CONSTANT_MACROS -D__STDC_FORMAT_MACROS -D__STDC_LIMIT_MACROS"
FLAGS="-std=c++17 -O1 -g -fsanitize=fuzzer,address -fno-omit-frame-pointer"
command -v "$CXX" >/dev/null || {
  echo "fuzz: $CXX not found (apt-get install -y clang-14, or set CXX_FUZZ)"
  exit 1
}
# Every source of the importer (lib/Import/CMakeLists.txt's PipecImport),
# instrumented; linked as objects, so the per-op registrations of ops/*.cpp
# (static initialisers) are kept.
SOURCES=(lib/Import/*.cpp lib/Import/ops/*.cpp tools/fuzz/import_fuzz.cpp)
echo "fuzz: compiling the importer (${#SOURCES[@]} files) with $CXX (libFuzzer + ASan)"
OBJECTS=()
for src in "${SOURCES[@]}"; do
  obj="$OUT/obj/${src//\//_}.o"
  mkdir -p "$OUT/obj"
  $CXX $FLAGS $DEFS $INC -c "$src" -o "$obj"
  OBJECTS+=("$obj")
done
$CXX $FLAGS "${OBJECTS[@]}" \
  build/lib/libPipecNN.a /usr/lib/llvm-22/lib/libMLIR.so.22.1 \
  /usr/lib/llvm-22/lib/libLLVM.so.1 -lonnx -lonnx_proto -lprotobuf -lpthread \
  -Wl,-rpath,/usr/lib/llvm-22/lib -o "$OUT/import_fuzz"
for f in /usr/share/libonnx-testdata/data/node/test_{gemm,conv,relu,softmax,reshape,layer_norm,batchnorm,gather,concat,slice,split,maxpool}*/model.onnx; do
  cp "$f" "$OUT/corpus/$(echo "$f" | tr / _)" 2>/dev/null || true
done
# What exporters write: torch.onnx.export in training mode (shape
# subgraphs, Dropout/BatchNormalization extra outputs, buffers).
cp test/e2e/torch_exported/resnet/model.onnx "$OUT/corpus/torch_resnet.onnx" 2>/dev/null || true
/usr/bin/python3 test/Import/Inputs/make_models.py "$OUT/lit-models" >/dev/null 2>&1 &&
  for f in exporter merged fixed_batch mask_unsqueeze runtime_mask; do
    cp "$OUT/lit-models/$f.onnx" "$OUT/corpus/lit_$f.onnx" 2>/dev/null || true
  done
echo "fuzz: running for $SECONDS_TO_RUN s on $(ls "$OUT/corpus" | wc -l) seed models"
ASAN_OPTIONS=detect_leaks=0 "$OUT/import_fuzz" -max_total_time="$SECONDS_TO_RUN" \
  -artifact_prefix="$OUT/" \
  -max_len=65536 -timeout=10 -rss_limit_mb=4096 "$@" "$OUT/corpus"
