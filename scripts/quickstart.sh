#!/usr/bin/env bash
# The main job: installs the Debian packages, builds pipec, generates the
# example MLP and a learnable dataset, compiles it into 4 pipeline stages
# (1F1B with flush, 8 microbatches) and trains it for 100 steps with 4 MPI
# processes on the CPU, printing the loss and throughput of every step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
export PATH="$PWD/build/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
/usr/bin/python3 examples/mlp/make_mlp.py --data-steps 8
pipec compile examples/mlp/mlp.onnx --stages 4 --microbatches 8 --schedule 1f1b-flush -o out/mlp
pipec train out/mlp --steps 100 --lr 0.5 --inputs examples/mlp/x.npy --labels examples/mlp/y.npy
