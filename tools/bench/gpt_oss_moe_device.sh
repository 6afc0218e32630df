#!/usr/bin/env bash
# gpt-oss's mixture of experts routed on the device, its clamped SwiGLU and YaRN rotation as
# kernels (docs/cuda.md, "Mixtures of experts"), on the GPU machine in one call of about 2 minutes:
#   cuda_moe  every test of crates/engine/tests/cuda_moe.rs: the new gpt-oss ones (rows 1–200
#             bit-identical to the same rows among 200, each row within bf16 rounding of host
#             routing; clamped_swiglu and rope_freqs against host emulations, plain frequencies bit
#             for bit rope_inplace) and the Qwen ones, which must pass unchanged (the route kernel
#             and the rope kernel changed under them)
#   cuda_ops  op parity, rope_bf16 included (its new scale argument is 1 there)
# Build (build machine, CARGO_INCREMENTAL=0), then carry $B:
#   cargo test -p draftlens-engine --test cuda_moe --test cuda_ops --no-run   # prints both paths
#   mkdir -p target-carry/oss-moe && cp <cuda_moe exe> target-carry/oss-moe/cuda_moe && \
#     cp <cuda_ops exe> target-carry/oss-moe/cuda_ops && strip target-carry/oss-moe/*
# Usage: bash tools/bench/gpt_oss_moe_device.sh target-carry/oss-moe
# The tests find the fixtures through the build machine's path (/work/main), linked here.
set -u
B=${1:-target-carry/oss-moe}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
mkdir -p /work && [ -e /work/main ] || ln -sfn "$PWD" /work/main
chmod +x "$B"/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
for t in cuda_moe cuda_ops; do
  s=$(date +%s)
  timeout 200 "$B/$t" --test-threads 1 --nocapture > "$OUT/$t.txt" 2>&1
  echo "== $t rc=$? $(( $(date +%s) - s )) s"
  grep -E "^test |test result|panicked|SKIP|rel |ulp off|bit-identical" "$OUT/$t.txt" | head -80
done
