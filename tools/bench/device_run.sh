#!/usr/bin/env bash
# One device call for issue 6 (docs/cuda.md, docs/benchmarks-cuda.md): CUDA tests, HF parity and
# the benchmarks, each bounded by a timeout and logged under $OUT.
#
# Binaries are built on the build machine (no cargo on the GPU machine) and carried in $BIN:
#   cargo test --release -p draftlens-engine --test cuda_ops --no-run
#   cargo build --release -p draftlens-engine --example cuda_bench --features kernel-lab --example cuda_hf_parity
#   mkdir -p target-carry/cuda && cp <test exe> target-carry/cuda/cuda_ops && cp target/release/examples/cuda_{bench,hf_parity} target-carry/cuda/
# Usage on the device: bash tools/bench/device_run.sh [target-carry/cuda] [steps...]
#   steps: tests parity bench hf  (default: all)
# Environment: BENCH_ARGS (extra cuda_bench arguments, e.g. "--only attention,gemm"),
#   TEST_TIMEOUT / BENCH_TIMEOUT (seconds, default 180 / 240).
# While the steps run, `nvidia-smi dmon` logs SM clock, power and temperature once a second to
# $OUT/dmon.log (read-only; the card's settings are never changed), so that sustained-load clock
# drops show next to the timings.
set -u
BIN=${1:-target-carry/cuda}
shift || true
STEPS=${*:-tests parity bench hf}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
export PYTHONUNBUFFERED=1
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.used,memory.total --format=csv,noheader
nvidia-smi dmon -s pc -d 1 > "$OUT/dmon.log" 2>&1 &
DMON=$!
if has tests; then
  echo "=== cuda_ops tests"
  timeout "${TEST_TIMEOUT:-180}" "$BIN/cuda_ops" --nocapture --test-threads=1 2>&1 | tee "$OUT/tests.log"
fi
if has parity; then
  echo "=== HF parity (Rust half)"
  timeout 120 "$BIN/cuda_hf_parity" /tmp/hfp 2>&1 | tee "$OUT/parity_rust.log"
  echo "=== HF parity (transformers half)"
  timeout 150 python3 tools/bench/hf_parity.py /tmp/hfp 2>&1 | tee "$OUT/parity_hf.log"
fi
if has bench; then
  echo "=== cuda_bench"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-240}" "$BIN/cuda_bench" --mix tools/bench/mix_lengths.txt --out "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
if has hf; then
  echo "=== transformers extraction baseline"
  timeout 240 python3 tools/bench/hf_extract.py --mix tools/bench/mix_lengths.txt 2>&1 | tee "$OUT/hf_extract.log"
fi
kill "$DMON" 2>/dev/null
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
