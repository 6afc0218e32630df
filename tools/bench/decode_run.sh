#!/usr/bin/env bash
# One device call for issue 11 items 3–4 (docs/cuda.md "Batch-invariant decode",
# docs/benchmarks-cuda.md "Decode"): the batch-invariance tests, the CUDA op tests, and the
# `decode` benchmark section, each bounded by a timeout and logged under $OUT.
#
# Binaries are built on the build machine (no cargo on the GPU machine), stripped and carried in $BIN:
#   cargo test -p draftlens-engine --test cuda_decode --no-run      # test profile: opt-level 3
#   cargo test -p draftlens-engine --test cuda_ops --no-run
#   cargo build --profile test -p draftlens-engine --example cuda_bench --features kernel-lab
#   cp <exes> $BIN/{cuda_decode,cuda_ops,cuda_bench} && strip $BIN/*
# Usage on the device: bash tools/bench/decode_run.sh [BIN] [steps...]   steps: decode ops bench
set -u
BIN=${1:-target-carry/cudadec}
shift || true
STEPS=${*:-decode ops bench}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.used,memory.total --format=csv,noheader
nvidia-smi dmon -s pc -d 1 > "$OUT/dmon.log" 2>&1 &
DMON=$!
if has decode; then
  echo "=== cuda_decode tests"
  timeout "${DECODE_TIMEOUT:-200}" "$BIN/cuda_decode" --nocapture --test-threads=1 2>&1 | tee "$OUT/decode_tests.log"
fi
if has ops; then
  echo "=== cuda_ops tests"
  timeout "${OPS_TIMEOUT:-120}" "$BIN/cuda_ops" --nocapture --test-threads=1 2>&1 | tee "$OUT/ops_tests.log"
fi
if has bench; then
  echo "=== cuda_bench --only decode"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-300}" "$BIN/cuda_bench" --only decode --out "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
kill "$DMON" 2>/dev/null
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
