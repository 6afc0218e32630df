#!/usr/bin/env bash
# Gated DeltaNet device run (docs/gdn-cuda.md, docs/benchmarks-cuda.md "Gated DeltaNet"). Prints
# first the per-phase table of the delta rule and the per-op table of the hybrid GDN layer
# (gdn_bench --breakdown, ~10 s), then the cuda_gdn tests, then every three-phase and split kernel
# at 4 x 4096 and 16 x 1024 tokens, then the breakdown at 1 x 16384. Logs under $OUT. Under 2 minutes.
# Binaries built on the build machine (no cargo on the GPU machine), stripped, carried in $B:
#   CARGO_INCREMENTAL=0 cargo build --profile test -p draftlens-engine --features kernel-lab --test cuda_gdn --example gdn_bench
#   # -> target/debug/deps/cuda_gdn-<hash> (the newest executable one), target/debug/examples/gdn_bench
#   # (the test profile is optimised)
#   mkdir -p target-carry/gdncuda && cp <test exe> target-carry/gdncuda/cuda_gdn \
#     && cp target/debug/examples/gdn_bench target-carry/gdncuda/ && strip target-carry/gdncuda/*
# On the device: bash tools/bench/gdn_device_run.sh [target-carry/gdncuda]
set -u
B=${1:-target-carry/gdncuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
timeout 60 $B/gdn_bench --seqs 4 --reps 7 --breakdown 2>&1 | tee $OUT/breakdown.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
echo "=== cuda_gdn tests"
timeout 150 $B/cuda_gdn --nocapture --test-threads=1 2>&1 | grep -v "registers, " | tee $OUT/tests.log
for a in "--seqs 4" "--seqs 16"; do
  echo "=== gdn_bench $a --only Split,ThreePhase"
  timeout 60 $B/gdn_bench $a --only Split,ThreePhase 2>&1 | tee -a $OUT/bench.log
done
echo "=== gdn_bench --seqs 1 --breakdown (one 16384-token sequence)"
timeout 60 $B/gdn_bench --seqs 1 --reps 5 --breakdown 2>&1 | tee -a $OUT/breakdown.log
$B/gdn_bench --seqs 1 --tokens 64 --reps 1 --only ThreePhase --report 2>&1 | grep registers > $OUT/kernels.log
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
