#!/usr/bin/env bash
# Makes the kernel images that ship with the binary (docs/cuda.md, "Kernel images that ship"):
# every module of kernels/*.cu compiled to a CUBIN for sm_90 (H100, H200) by the pinned NVRTC
# wheel, written to crates/engine/src/backend/cuda/kernel_images/. Run it after changing a kernel:
# the test `shipped_kernel_images_are_current_and_whole` fails until it has run. Needs no GPU.
#   tools/ship_kernel_images.sh            # then commit kernel_images/
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# The NVRTC of the GPU machine's CUDA 13.0, from PyPI (sha256 of the wheel pinned).
VERSION=13.0.88
WHEEL=nvidia_cuda_nvrtc-$VERSION-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
SHA256=ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575
dir=${DRAFTLENS_NVRTC_DIR:-$HOME/.cache/draftlens/nvrtc-$VERSION}
if [ ! -e "$dir/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  mkdir -p "$dir"
  python3 -m pip download --no-deps --quiet "nvidia-cuda-nvrtc==$VERSION" \
    --platform manylinux_2_12_x86_64 --only-binary=:all: -d "$dir"
  echo "$SHA256  $dir/$WHEEL" | sha256sum -c --quiet
  python3 -m zipfile -e "$dir/$WHEEL" "$dir"
fi
LD_LIBRARY_PATH="$dir/nvidia/cu13/lib" cargo run --release -q -p draftlens-engine \
  --example ship_kernel_images -- "$VERSION" sm_90
