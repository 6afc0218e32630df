#!/usr/bin/env bash
# Makes the kernel images that ship with the binary (docs/cuda.md, "Kernel images that ship"):
# every module of kernels/*.cu compiled to a CUBIN for sm_90 (H100, H200) by the NVRTC pinned in
# scripts/requirements-kernels.txt (the GPU machine's own), written to
# crates/engine/src/backend/cuda/kernel_images/. Run it after changing a kernel: the test
# `shipped_kernel_images_are_current_and_whole` fails until it has run. Needs no GPU.
#   tools/ship_kernel_images.sh            # then commit kernel_images/
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
T=${KERNEL_TOOLS:-$HOME/.cache/draftlens/kernel-tools}
# Fetches and unpacks the pinned NVRTC and ptxas once (and checks one small module).
bash scripts/check-kernels.sh --only convert > /dev/null
VERSION=$(sed -n 's/^nvidia-cuda-nvrtc==\([0-9.]*\) .*/\1/p' scripts/requirements-kernels.txt)
LD_LIBRARY_PATH="$T" cargo run --release -q -p draftlens-engine \
  --example ship_kernel_images -- "$VERSION" sm_90
