#!/usr/bin/env bash
# The GPU suite, in two halves (the GPU machine has neither the compiler's
# MLIR/LLVM nor a package registry; the build machine has no GPU):
#
#   scripts/test-gpu.sh prepare   on the build machine, after scripts/build.sh:
#       downloads the Debian packages the stage executables need there
#       (OpenMPI and its libraries, OpenBLAS) with apt-get download, and
#       writes .gpu-bundle/: those packages, libpipec_rt_cuda.so, the kernel
#       test binary and the e2e cases (CUDA run folders plus the CPU run's
#       losses and final weights; test/gpu/gpu_e2e.py).
#   scripts/test-gpu.sh run       on the GPU machine, in a copy of the
#       repository with .gpu-bundle/ beside it: unpacks the packages into a
#       private prefix, runs every CUDA kernel against its CPU twin
#       (pipec_cuda_tests), runs the communicator contract five ways
#       (host-staged, CUDA IPC (the default), NCCL's sums, and NCCL's sums
#       and messages across ranks given hosts of their own by NCCL_HOSTID),
#       times the messages between two ranks on the GPU, host-staged and
#       by CUDA IPC, and between host buffers (pipec-linkprobe(-cuda); fit
#       them here with pipec topology --fit), reads pipec's exported
#       schedule CSVs with PyTorch's torch.distributed.pipelining
#       (test/gpu/torch_csv.py), then the e2e cases; the last line is the
#       summary of the checks `N passed, M failed`, then the benchmark
#       bench/gpu_compare.py (pipec against PyTorch on the same GPU).
#   scripts/test-gpu.sh bench     the benchmark alone.
#
# Variables: PIPEC_GPU_ONLY=CASE,... runs only those e2e cases (no kernel
# tests, no schedule CSVs); PIPEC_GPU_BENCH=0 leaves the benchmark out;
# PIPEC_GPU_LINK_VARIANTS=1 probes the link under other MPI settings too;
# PIPEC_BENCH_GPT3=0 leaves out the GPT-3 layer's kernels
# (bench/gpt3_layer_kernels.py); PIPEC_BENCH_TIMEOUT_S (default 400) caps
# the benchmark; the benchmark's own (PIPEC_BENCH_*) are in
# bench/gpu_compare.py. Every step has a time limit, and the results so far
# are packed into $OUT after each part. PIPEC_GPU_DEADLINE_S=N ends the
# whole run within N seconds (the device tool's command limit): each step's
# limit is cut to what is left, the e2e cases leave PIPEC_GPU_BENCH_RESERVE_S
# (default 0) to the benchmark, and a step with under 20 s left is skipped
# with a line saying so.
#
# With the device tool: run(command="scripts/test-gpu.sh run",
# carry=[".gpu-bundle/debs", ".gpu-bundle/packed.tar.gz"]). Results go to
# .gpu-bundle/results, and with $OUT set (the device tool) into
# $OUT/results.tgz, with e2e.log and bench.log beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUNDLE=$ROOT/.gpu-bundle

prepare() {
  local build=${PIPEC_BUILD:-$ROOT/build}
  [ -x "$build/bin/pipec" ] || { echo "test-gpu: build first (scripts/build.sh)"; exit 1; }
  [ -f "$build/runtime/libpipec_rt_cuda.so" ] || {
    echo "test-gpu: this build has no CUDA runtime (no CUDA toolkit found at configure time)"; exit 1; }
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/debs" "$BUNDLE/lib" "$BUNDLE/bin"
  (cd "$BUNDLE/debs" && apt-get download -q \
    openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 libevent-2.1-7 \
    libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libibverbs1 libnl-3-200 \
    libnl-route-3-200 librdmacm1 libpsm-infinipath1 libpsm2-2 libucx0 libmunge2 \
    libnuma1 libopenblas0-pthread libgfortran5 libudev1 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  cp "$build/runtime/libpipec_rt_cuda.so" "$build/runtime/libpipec_rt_cuda_check.so" "$BUNDLE/lib/"
  cp "$build/runtime/cuda/tests/pipec_cuda_tests" "$BUNDLE/bin/"
  cp "$build/runtime/cuda/tests/pipec_cuda_communicator_contract" "$BUNDLE/bin/"
  cp "$build/bin/pipec-linkprobe-cuda" "$build/bin/pipec-linkprobe" "$BUNDLE/bin/"
  /usr/bin/python3 test/gpu/gpu_e2e.py prepare --pipec "$build/bin/pipec" --bundle "$BUNDLE"
  # pipec's exported schedules, for PyTorch's own reader there.
  /usr/bin/python3 test/gpu/torch_csv.py prepare --pipec "$build/bin/pipec" --bundle "$BUNDLE"
  /usr/bin/python3 bench/gpu_compare.py prepare --pipec "$build/bin/pipec" --bundle "$BUNDLE" \
    --config "${PIPEC_GPU_BENCH_CONFIG:-small}"
  # What a call to the GPU machine carries is limited (64 MiB with the
  # repository): everything but the packages also goes into one archive
  # (the stage executables' constants compress well).
  (cd "$BUNDLE" && tar czf packed.tar.gz bin lib cases cases.json bench torch_csv)
  du -sh "$BUNDLE" "$BUNDLE/packed.tar.gz"
}

run() {
  [ -d "$BUNDLE/debs" ] || { echo "test-gpu: no $BUNDLE (scripts/test-gpu.sh prepare, then carry it)"; exit 1; }
  if [ -f "$BUNDLE/packed.tar.gz" ]; then
    tar xzf "$BUNDLE/packed.tar.gz" -C "$BUNDLE"
  fi
  local P=/tmp/pipec-gpu-deps
  rm -rf "$P"; mkdir -p "$P"
  for f in "$BUNDLE"/debs/*.deb; do dpkg -x "$f" "$P"; done
  export OPAL_PREFIX=$P/usr
  export PMIX_INSTALL_PREFIX=$P/usr/lib/x86_64-linux-gnu/pmix2
  export PMIX_MCA_pcompress_base_silence_warning=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mca_base_component_show_load_errors=0
  local cublas
  cublas=$(dirname "$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)")
  # cuDNN (opened at run time by the convolutions; im2col + cuBLAS
  # without it): the toolkit's, else the one PyTorch's wheels bring.
  local cudnn
  cudnn=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt -name 'libcudnn.so.9*' 2>/dev/null | head -1)
  [ -n "$cudnn" ] || cudnn=$(python3 -c 'import glob, os, nvidia.cudnn as m; print((glob.glob(os.path.join(list(m.__path__)[0], "lib", "libcudnn.so.9*")) or [""])[0])' 2>/dev/null || true)
  cudnn=${cudnn:+$(dirname "$cudnn")}
  echo "cuDNN from ${cudnn:-nowhere (convolutions on im2col + cuBLAS)}"
  # NCCL (opened at run time with PIPEC_NCCL=1): the toolkit's, else
  # PyTorch's wheel's.
  local nccl
  nccl=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt -name 'libnccl.so.2*' 2>/dev/null | head -1)
  [ -n "$nccl" ] || nccl=$(python3 -c 'import glob, os, nvidia.nccl as m; print((glob.glob(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2*")) or [""])[0])' 2>/dev/null || true)
  nccl=${nccl:+$(dirname "$nccl")}
  echo "NCCL from ${nccl:-nowhere}"
  export LD_LIBRARY_PATH=$BUNDLE/lib:$cublas:${cudnn:+$cudnn:}${nccl:+$nccl:}$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu:$P/usr/lib/x86_64-linux-gnu/openblas-pthread:${LD_LIBRARY_PATH:-}
  export PATH=$P/usr/bin:$PATH
  # Every result goes to $BUNDLE/results. The device tool brings back at
  # most 8 files from $OUT: there, when this script ends, they are packed
  # into $OUT/results.tgz beside the summary logs. (A `timeout` around the
  # script stops it only once its current step ends: pack again after it.)
  local out=$BUNDLE/results
  rm -rf "$out"; mkdir -p "$out"
  export PIPEC_GPU_RESULTS=$out
  # pack: the results so far into $OUT (after each part too, in case the
  # device tool stops the command before the trap runs; never fails).
  pack() {
    [ -n "${OUT:-}" ] || return 0
    tar czf "$OUT/results.tgz" -C "$BUNDLE" results 2>/dev/null || true
    cp "$BUNDLE/results/e2e.log" "$BUNDLE/results/bench.log" "$OUT/" 2>/dev/null || true
  }
  trap pack EXIT
  nvidia-smi -L || true
  echo "cuBLAS from $cublas"
  local rc=0
  # limit WANT [RESERVE]: WANT seconds, or what is left before the deadline
  # less RESERVE and 10 s for packing, whichever is less (0: skip the step).
  local deadline=$((SECONDS + ${PIPEC_GPU_DEADLINE_S:-1000000}))
  limit() {
    local want=$1 left=$((deadline - SECONDS - ${2:-0} - 10))
    [ "$left" -lt "$want" ] && want=$left
    [ "$want" -lt 20 ] && want=0
    echo "$want"
  }
  skipped() { echo "test-gpu: skipped $1: the deadline (PIPEC_GPU_DEADLINE_S) is too close"; rc=1; return 1; }
  # bounded WANT NAME COMMAND...: COMMAND under timeout's limit(WANT), or
  # skipped (status 1) where none is left. (timeout 0 would mean none.)
  bounded() {
    local t name=$2; t=$(limit "$1"); shift 2
    [ "$t" -gt 0 ] || { skipped "$name"; return 1; }
    timeout -k 10 "$t" "$@"
  }
  # The kernels of one GPT-3 layer (t = 8) in PyTorch bf16, for the GPT-3
  # anchor's measured efficiencies (bench/gpt3_layer_kernels.py says how
  # they are used here); half a minute, early, as it is short.
  # PIPEC_BENCH_GPT3=0 (or PIPEC_GPU_BENCH=0) skips it.
  gpt3_layer() {
    [ "${PIPEC_BENCH_GPT3:-1}" != 0 ] && [ "${PIPEC_GPU_BENCH:-1}" != 0 ] || return 0
    bounded 180 "the GPT-3 layer's kernels" python3 bench/gpt3_layer_kernels.py \
      --out "$out/profile_gpt3_layer_bf16.json" 2>&1 | tee "$out/gpt3_layer.log" || true
    pack
  }
  if [ -z "${PIPEC_GPU_BENCH_ONLY:-}" ]; then
  # PIPEC_GPU_ONLY=CASE,... runs those e2e cases without the kernel tests
  # and the schedule CSVs (the communicator's checks and link still run).
  if [ -z "${PIPEC_GPU_ONLY:-}" ]; then
  bounded 300 "the kernel tests" "$BUNDLE/bin/pipec_cuda_tests" --gtest_brief=1 2>&1 | tee "$out/kernels.log" | tail -40 || rc=1
  grep -q "FAILED" "$out/kernels.log" && rc=1
  grep -q "PASSED" "$out/kernels.log" || rc=1
  pack
  gpt3_layer
  fi
  # The communicator contract with tensors in GPU memory, 3 ranks sharing
  # the GPU: contract LOG SECONDS MARKER [hosts] [VAR=VALUE ...] runs it
  # with those variables ("hosts": each rank an NCCL_HOSTID of its own, a
  # host of its own to NCCL, which then passes its duplicate-GPU check and
  # joins the ranks over its socket transport on loopback; the runtime keys
  # NCCL's groups the same way, cuda/comm_cuda.cpp). It passes when the
  # summary says 0 failed and the log holds MARKER, the transport's name.
  contract() {
    local log=$out/$1 seconds=$2 marker=$3
    shift 3
    local wrap=()
    if [ "${1:-}" = hosts ]; then
      wrap=(sh -c 'NCCL_HOSTID=pipec-rank-$OMPI_COMM_WORLD_RANK exec "$0"')
      shift
    fi
    bounded "$seconds" "the communicator contract ($log)" env "$@" "$P/usr/bin/orterun" --oversubscribe --bind-to none -n 3 \
      "${wrap[@]}" "$BUNDLE/bin/pipec_cuda_communicator_contract" > "$log" 2>&1 || rc=1
    # (grep finds nothing in a log of NCCL INFO lines only, a killed run's:
    # not a reason to end the script, under pipefail.)
    { grep -v "NCCL INFO" "$log" || true; } | tail -3
    grep -qE "^[0-9]+ passed, 0 failed" "$log" || rc=1
    grep -q "$marker" "$log" || { echo "contract: no '$marker' in $log"; rc=1; }
  }
  # Host-staged, then the default (CUDA IPC between the ranks), then with
  # NCCL's sums (on one GPU only groups of one rank may use them: NCCL
  # refuses two ranks on a GPU).
  contract communicator.log 90 "MPI (host-staged): ok" PIPEC_CUDA_IPC=0
  contract communicator_ipc.log 90 "CUDA IPC"
  contract communicator_nccl.log 90 "NCCL sums" PIPEC_NCCL=1
  # NCCL across the ranks given hosts of their own: sums over all three,
  # then every tensor message by ncclSend/ncclRecv (PIPEC_NCCL_P2P=1: the
  # contract's tags asked in other orders than sent, sizes that differ,
  # posted receives).
  contract communicator_nccl_hosts.log 60 "nranks 3 .*Init COMPLETE" hosts \
    NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 PIPEC_NCCL=1
  contract communicator_nccl_p2p.log 60 "NCCL messages" hosts \
    NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 PIPEC_NCCL_P2P=1
  # The link between two stage processes sharing the GPU, as their
  # messages cross it (fitted here: pipec topology --fit linkprobe_cuda.json),
  # host-staged and by CUDA IPC.
  pack
  PIPEC_CUDA_IPC=0 bounded 90 "the link probe" "$P/usr/bin/orterun" --oversubscribe --bind-to none -n 2 \
    "$BUNDLE/bin/pipec-linkprobe-cuda" --out "$out/linkprobe_cuda.json" || rc=1
  [ -f "$out/linkprobe_cuda.json" ] && cat "$out/linkprobe_cuda.json"
  bounded 90 "the link probe (CUDA IPC)" "$P/usr/bin/orterun" --oversubscribe --bind-to none -n 2 \
    "$BUNDLE/bin/pipec-linkprobe-cuda" --out "$out/linkprobe_cuda_ipc.json" || rc=1
  [ -f "$out/linkprobe_cuda_ipc.json" ] && cat "$out/linkprobe_cuda_ipc.json"
  # The same between host buffers, to tell MPI's share from the GPU's (on
  # the H200 of 2026-11-27 messages up to 16 KiB took 152 us with GPU
  # buffers and 32 KiB ones 28 us).
  bounded 90 "the link probe (host buffers)" "$P/usr/bin/orterun" --oversubscribe --bind-to none -n 2 \
    "$BUNDLE/bin/pipec-linkprobe" --out "$out/linkprobe_cpu.json" || true
  [ -f "$out/linkprobe_cpu.json" ] && cat "$out/linkprobe_cpu.json"
  # PIPEC_GPU_LINK_VARIANTS=1: the host-staged probe under other MPI
  # settings, to find where small messages between CUDA ranks lose their
  # time (150 us up to 16 KiB against 27 us at 32 KiB on an H200).
  if [ "${PIPEC_GPU_LINK_VARIANTS:-0}" = 1 ]; then
    local v
    for v in pml_ob1:OMPI_MCA_pml=ob1 pml_ucx:OMPI_MCA_pml=ucx \
             no_yield:OMPI_MCA_mpi_yield_when_idle=0 \
             vader_eager64k:OMPI_MCA_btl_vader_eager_limit=65536; do
      env PIPEC_CUDA_IPC=0 "${v#*:}" timeout 60 "$P/usr/bin/orterun" --oversubscribe --bind-to none -n 2 \
        "$BUNDLE/bin/pipec-linkprobe-cuda" --out "$out/linkprobe_${v%%:*}.json" >/dev/null 2>&1 || true
      [ -f "$out/linkprobe_${v%%:*}.json" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[2], ' '.join(f'{s*1e6:.1f}' for s in d['seconds'][:14]), 'us (8 B .. 64 KiB)')" \
        "$out/linkprobe_${v%%:*}.json" "${v%%:*}" || true
    done
  fi
  if [ -z "${PIPEC_GPU_ONLY:-}" ]; then
  # The exported schedule CSVs through torch.distributed.pipelining's reader.
  bounded 120 "the schedule CSVs" python3 test/gpu/torch_csv.py run --bundle "$BUNDLE" 2>&1 | tee "$out/torch_csv.log" || rc=1
  tail -1 "$out/torch_csv.log" | grep -q " 0 failed" || rc=1
  fi
  pack
  local t; t=$(limit 1800 "${PIPEC_GPU_BENCH_RESERVE_S:-0}")
  if [ "$t" -gt 0 ]; then
    PYTHONUNBUFFERED=1 timeout -k 10 "$t" python3 test/gpu/gpu_e2e.py run --bundle "$BUNDLE" \
      --mpirun "$P/usr/bin/orterun" ${PIPEC_GPU_ONLY:+--only "$PIPEC_GPU_ONLY"} 2>&1 | tee "$out/e2e.log" || rc=1
    tail -1 "$out/e2e.log" | grep -q " 0 failed" || rc=1
  else
    skipped "the e2e cases" || true
  fi
  pack
  fi
  # The benchmark (figures, not checks): PIPEC_GPU_BENCH=0 skips it.
  if [ "${PIPEC_GPU_BENCH:-1}" != 0 ]; then
    [ -n "${PIPEC_GPU_BENCH_ONLY:-}" ] && gpt3_layer
    # At most PIPEC_BENCH_TIMEOUT_S (default 400 s: with the GPT-3 step's
    # 180 s at most, within the device tool's 600 s command limit), so that
    # what it measured comes back (each pipec row is printed as it ends).
    t=$(limit "${PIPEC_BENCH_TIMEOUT_S:-400}")
    if [ "$t" -gt 0 ]; then
      PYTHONUNBUFFERED=1 timeout -k 10 "$t" python3 bench/gpu_compare.py run \
        --bundle "$BUNDLE" --mpirun "$P/usr/bin/orterun" --out "$out/gpu_compare.json" 2>&1 |
        tee "$out/bench.log" || true
    else
      skipped "the benchmark" || true
    fi
  fi
  return $rc
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  # The benchmark alone (carry .gpu-bundle/debs, lib, bin and bench only).
  bench) PIPEC_GPU_BENCH_ONLY=1 run ;;
  *) echo "usage: scripts/test-gpu.sh prepare|run|bench"; exit 2 ;;
esac
