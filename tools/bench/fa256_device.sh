#!/usr/bin/env bash
# flash_attention2_hd256 on the GPU machine (docs/cuda.md "Kernels"): its tests, the attention A/B at
# Qwen3.6-27B's gated-attention shape, and the product's packed prefill of a hybrid target, in one
# device call of about 3 minutes.
#   tests     cuda_attention (hd 256 against the CPU reference and the first kernel, fused QKV,
#             a small hybrid's prefill), then cuda_ops (op parity incl. hd 256 GQA 6:1, fused ops)
#   attn      cuda_bench --only attention256: 16 causal varlen launches at 4 × 4096 tokens, 24/4 heads
#             of 256, flash_attention_hd256 (v1) against flash_attention2_hd256 (v2, also on a fused
#             QKV output), and how far their outputs differ
#   target    cuda_bench --only ceilings,target on the model folder $M at 4 × 4096 tokens: both Gated
#             DeltaNet profiles with flash_attention2, then the first profile with the first kernel
# Build (build machine, CARGO_INCREMENTAL=0), then carry $B:
#   cargo test --release --workspace --test cuda_ops --test cuda_attention --no-run   # prints both paths
#   cargo build --release -p draftlens-engine --example cuda_bench --features kernel-lab
#   mkdir -p target-carry/fa256 && cp <cuda_ops exe> target-carry/fa256/cuda_ops && \
#     cp <cuda_attention exe> target-carry/fa256/cuda_attention && \
#     cp $CARGO_TARGET_DIR/release/examples/cuda_bench target-carry/fa256/ && strip target-carry/fa256/*
# Usage: [STEPS="tests attn target"] bash tools/bench/fa256_device.sh target-carry/fa256 [MODEL_DIR]
set -u
B=${1:-target-carry/fa256}
M=${2:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
STEPS=${STEPS:-tests attn target}
has() { [[ " $STEPS " == *" $1 "* ]]; }
LOG="$OUT/fa256.log" TIMED_DIR=$OUT TIMED_OUT_BYTES=6000
source tools/bench/timed.sh
chmod +x "$B"/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee -a "$LOG"
if has tests; then
  timed cuda_attention timeout 90 "$B/cuda_attention" --nocapture --test-threads=1
  timed cuda_ops timeout 120 "$B/cuda_ops" --nocapture --test-threads=1
fi
if has attn; then
  timed attention256 timeout 90 "$B/cuda_bench" --only attention256 --out "$OUT/bench_attention256.json"
fi
if has target; then
  if [ -n "$M" ] && [ -e "$M/config.json" ]; then
    timed target timeout 240 "$B/cuda_bench" --only ceilings,target --target "$M" --target-seqs 4x4096 --forwards 3 --out "$OUT/bench_target.json"
  else
    log "target: skipped (no model folder with a config.json given: '$M')"
  fi
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a "$LOG"
