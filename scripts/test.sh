#!/usr/bin/env bash
# Installs the Debian packages, builds pipec and runs every test: lit
# (importer, dialects, passes), gtest (planner, schedules, runtime kernels
# and core), the multi-process runtime tests, ONNX's operator conformance
# data and the end-to-end pipeline equivalence and bad-input tests. The
# last line is ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd build
ctest --output-on-failure -j "${PIPEC_TEST_JOBS:-2}" --timeout 900
