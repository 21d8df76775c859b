#!/usr/bin/env bash
# Installs every Debian package pipec needs to build, test and run (DESIGN.md §8).
# Idempotent; run as root or with sudo available.
set -euo pipefail
PKGS=(
  cmake ninja-build ccache g++ pkg-config
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
  libonnx-dev libonnx-testdata libprotobuf-dev protobuf-compiler
  libopenmpi-dev openmpi-bin libopenblas-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-onnx python3-numpy
  # lint.python_scripts: names the scripts use but never define.
  python3-pyflakes
  # A private one-node SLURM for e2e.slurm (pipec train --launcher srun).
  slurmctld slurmd slurm-client munge
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
