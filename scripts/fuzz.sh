#!/usr/bin/env bash
# Builds a libFuzzer target with clang-14 (ASan + libFuzzer; UBSan too for
# the file readers) against an existing build/ and runs it for a while:
#   scripts/fuzz.sh importer [SECONDS] [extra libFuzzer args] (SECONDS: 120)
#       the ONNX importer (tools/fuzz/import_fuzz.cpp), seeded with ONNX's
#       operator test models, a torch export and the lit tests' models;
#   scripts/fuzz.sh formats [SECONDS] [extra libFuzzer args]
#       the readers of the other files users hand pipec and the runtime
#       (tools/fuzz/formats_fuzz.cpp: .npy, safetensors, stage description,
#       manifest, plan, profile, topology and device JSON, schedule CSV),
#       seeded with the examples' documents and the files a real compile
#       writes (made in a scratch folder with build/bin/pipec).
# Not part of CI (minutes, not seconds). Each target keeps its corpus in
# build-fuzz/, where crashes land too (import-crash-*, formats-crash-*).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:-}
case "$TARGET" in
  importer | formats) shift ;;
  *) echo "usage: scripts/fuzz.sh importer|formats [SECONDS] [libFuzzer args]"; exit 2 ;;
esac
SECONDS_TO_RUN=120
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  SECONDS_TO_RUN=$1
  shift
fi
CXX=${CXX_FUZZ:-clang++-14}
OUT=build-fuzz
command -v "$CXX" >/dev/null || {
  echo "fuzz: $CXX not found (apt-get install -y clang-14, or set CXX_FUZZ)"
  exit 1
}

# compile_objects NAME FLAGS INCLUDES SOURCES...: the instrumented objects,
# listed in OBJECTS. They are kept between runs in a folder named after the
# compiler and flags, and rebuilt when their source or a header it
# includes (the compiler's -MMD list) is newer.
compile_objects() {
  local name=$1 flags=$2 inc=$3 src obj dir dep
  shift 3
  dir=$OUT/$name-obj-$(echo "$CXX $flags $inc" | md5sum | cut -c1-8)
  OBJECTS=()
  mkdir -p "$dir"
  echo "fuzz: compiling $name ($# files) with $CXX"
  for src in "$@"; do
    obj="$dir/${src//\//_}.o"
    local stale=1
    if [ -f "$obj" ] && [ -f "${obj%.o}.d" ]; then
      stale=0
      for dep in $(sed -e 's/\\$//' -e 's/^[^:]*://' "${obj%.o}.d"); do
        if [ "$dep" -nt "$obj" ]; then stale=1; break; fi
      done
    fi
    if [ "$stale" = 1 ]; then
      $CXX $flags $inc -MMD -MF "${obj%.o}.d" -c "$src" -o "$obj"
    fi
    OBJECTS+=("$obj")
  done
}

if [ "$TARGET" = importer ]; then
  CORPUS=$OUT/corpus
  [ -f build/lib/libPipecNN.a ] || { echo "build pipec first (scripts/build.sh)"; exit 1; }
  FLAGS="-std=c++17 -O1 -g -fsanitize=fuzzer,address -fno-omit-frame-pointer"
  DEFS="-DONNX_NAMESPACE=onnx -DONNX_ML=1 -D_GNU_SOURCE -D__STDC_CONSTANT_MACROS -D__STDC_FORMAT_MACROS -D__STDC_LIMIT_MACROS"
  # Every source of the importer (lib/Import/CMakeLists.txt's PipecImport),
  # instrumented; linked as objects, so the per-op registrations of
  # ops/*.cpp (static initialisers) are kept.
  compile_objects import "$FLAGS $DEFS" \
    "-Iinclude -I. -Ibuild -isystem /usr/lib/llvm-22/include" \
    lib/Import/*.cpp lib/Import/ops/*.cpp tools/fuzz/import_fuzz.cpp
  $CXX $FLAGS "${OBJECTS[@]}" \
    build/lib/libPipecNN.a /usr/lib/llvm-22/lib/libMLIR.so.22.1 \
    /usr/lib/llvm-22/lib/libLLVM.so.1 -lonnx -lonnx_proto -lprotobuf -lpthread \
    -Wl,-rpath,/usr/lib/llvm-22/lib -o "$OUT/import_fuzz"
  mkdir -p "$CORPUS"
  for f in /usr/share/libonnx-testdata/data/node/test_{gemm,conv,relu,softmax,reshape,layer_norm,batchnorm,gather,concat,slice,split,maxpool}*/model.onnx; do
    cp "$f" "$CORPUS/$(echo "$f" | tr / _)" 2>/dev/null || true
  done
  # What exporters write: torch.onnx.export in training mode (shape
  # subgraphs, Dropout/BatchNormalization extra outputs, buffers).
  cp test/e2e/torch_exported/resnet/model.onnx "$CORPUS/torch_resnet.onnx" 2>/dev/null || true
  /usr/bin/python3 test/Import/Inputs/make_models.py "$OUT/lit-models" >/dev/null 2>&1 &&
    for f in exporter merged fixed_batch mask_unsqueeze runtime_mask; do
      cp "$OUT/lit-models/$f.onnx" "$CORPUS/lit_$f.onnx" 2>/dev/null || true
    done
  BINARY=$OUT/import_fuzz
  PREFIX=$OUT/import-
else
  CORPUS=$OUT/formats-corpus
  FLAGS="-std=c++17 -O1 -g -fexceptions -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  # The readers and what they call: plain C++ and nlohmann-json, no MLIR.
  compile_objects formats "$FLAGS" "-Iinclude -Iformats/include -Iruntime/include" \
    formats/*.cpp lib/Cost/*.cpp lib/Plan/*.cpp lib/Schedule/*.cpp \
    tools/fuzz/formats_fuzz.cpp
  $CXX $FLAGS "${OBJECTS[@]}" -o "$OUT/formats_fuzz"
  mkdir -p "$CORPUS"
  # Seeds: the selector byte (formats_fuzz.cpp's switch), then the file.
  seed() { # seed SELECTOR FILE
    [ -f "$2" ] || return 0
    { printf "\\$(printf '%03o' "$1")"; cat "$2"; } > "$CORPUS/$1-$(echo "$2" | tr / _)"
  }
  for f in examples/profiles/*.json; do seed 5 "$f"; done
  for f in examples/topologies/*.json; do seed 6 "$f"; done
  for f in examples/devices/*.json; do seed 7 "$f"; done
  for f in bench/data/*/plan_*.json; do seed 4 "$f"; done
  W=$(mktemp -d)
  trap 'rm -rf "$W"' EXIT
  if [ -x build/bin/pipec ]; then
    build/bin/pipec compile examples/mlp/mlp.onnx --stages 2 --microbatches 4 \
      --schedule zb-h1 -o "$W/run" >/dev/null 2>&1 || true
    build/bin/pipec plan --profile examples/profiles/vgg16.json \
      --topology examples/topologies/pipedream-cluster-a-4x4.json --stages 4 \
      --microbatches 8 --schedule zb-h1 --export torch --export-file "$W/zb.csv" \
      -o "$W/plan.json" >/dev/null 2>&1 || true
    seed 3 "$W/run/manifest.json"
    seed 4 "$W/run/plan.json"
    seed 4 "$W/plan.json"
    seed 8 "$W/zb.csv"
    if [ -f "$W/run/stage0" ]; then
      strings -n 50 "$W/run/stage0" | grep -m1 '"pipec.stage/2"' > "$W/stage0.json" || true
      seed 2 "$W/stage0.json"
    fi
  fi
  S=$W/small
  mkdir -p "$S"
  /usr/bin/python3 - "$S" <<'PY'
import json, struct, sys, numpy
d = sys.argv[1]
numpy.save(f"{d}/x.npy", numpy.zeros((2, 3), "float32"))
numpy.save(f"{d}/y.npy", numpy.arange(4))
header = json.dumps({"__metadata__": {"format": "pt"},
                     "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                     "b": {"dtype": "I64", "shape": [1], "data_offsets": [16, 24]}}).encode()
with open(f"{d}/small.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + bytes(24))
PY
  seed 0 "$S/x.npy"
  seed 0 "$S/y.npy"
  seed 1 "$S/small.safetensors"
  BINARY=$OUT/formats_fuzz
  PREFIX=$OUT/formats-
fi
echo "fuzz: running $TARGET for $SECONDS_TO_RUN s on $(ls "$CORPUS" | wc -l) inputs"
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
  "$BINARY" -max_total_time="$SECONDS_TO_RUN" -artifact_prefix="$PREFIX" \
  -max_len=65536 -timeout=10 -rss_limit_mb=4096 "$@" "$CORPUS"
