#!/usr/bin/env bash
# Gated DeltaNet device run (docs/gdn-cuda.md, docs/benchmarks-cuda.md "Gated DeltaNet"):
# cuda_gdn tests, then gdn_bench: every variant at 4 x 4096 tokens, then the split kernels against
# the three-phase ones at 16 x 1024 and 1 x 16384. Logs under $OUT. About 2-3 minutes.
# Binaries built on the build machine (no cargo on the GPU machine), stripped, carried in $B:
#   CARGO_INCREMENTAL=0 cargo test --workspace --test cuda_gdn --no-run   # -> target/debug/deps/cuda_gdn-*
#   CARGO_INCREMENTAL=0 cargo build --profile test --workspace --example gdn_bench  # -> target/debug/examples/gdn_bench
#   (the test profile is optimised; with --release the paths are target/release/...)
#   mkdir -p target-carry/gdncuda && cp <test exe> target-carry/gdncuda/cuda_gdn \
#     && cp target/debug/examples/gdn_bench target-carry/gdncuda/ && strip target-carry/gdncuda/*
# On the device: bash tools/bench/gdn_device_run.sh [target-carry/gdncuda]
set -u
B=${1:-target-carry/gdncuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
echo "=== cuda_gdn tests"
timeout 200 $B/cuda_gdn --nocapture --test-threads=1 2>&1 | grep -v "registers, " | tee $OUT/tests.log
echo "=== gdn_bench --seqs 4 (every variant, the hybrid layer with the fastest engine kernel)"
timeout 90 $B/gdn_bench --seqs 4 2>&1 | grep -v "registers, 0 B local" | tee -a $OUT/bench.log
for a in "--seqs 16" "--seqs 1 --reps 5"; do
  echo "=== gdn_bench $a --only Split,ThreePhase"
  timeout 60 $B/gdn_bench $a --only Split,ThreePhase 2>&1 | grep -v "registers, 0 B local" | tee -a $OUT/bench.log
done
$B/gdn_bench --seqs 1 --tokens 64 --reps 1 --only ThreePhase 2>&1 | grep registers > $OUT/kernels.log
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
