#!/usr/bin/env bash
# Gated DeltaNet device run (docs/gdn-cuda.md, docs/benchmarks-cuda.md "Gated DeltaNet"):
# cuda_gdn tests, then gdn_bench at three packings of 16k tokens. Logs under $OUT.
# Binaries built on the build machine (no cargo on the GPU machine), stripped, carried in $B:
#   cargo test --release -p draftlens --test cuda_gdn --no-run     # -> target/release/deps/cuda_gdn-*
#   cargo build --release -p draftlens --example gdn_bench
#   mkdir -p target-carry/gdncuda && cp <test exe> target-carry/gdncuda/cuda_gdn \
#     && cp target/release/examples/gdn_bench target-carry/gdncuda/ && strip target-carry/gdncuda/*
# On the device: bash tools/bench/gdn_device_run.sh [target-carry/gdncuda]
set -u
B=${1:-target-carry/gdncuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
echo "=== cuda_gdn tests"
timeout 200 $B/cuda_gdn --nocapture --test-threads=1 2>&1 | grep -v "registers, " | tee $OUT/tests.log
for a in "--seqs 4" "--seqs 16" "--seqs 1 --reps 5"; do
  echo "=== gdn_bench $a"
  timeout 120 $B/gdn_bench $a 2>&1 | grep -v "registers, 0 B local" | tee -a $OUT/bench.log
done
$B/gdn_bench --seqs 1 --tokens 64 --reps 1 2>&1 | grep registers > $OUT/kernels.log
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
