#!/usr/bin/env bash
# One device call for the end-to-end figures of docs/benchmarks-cuda.md: the draftlens side of the
# end-to-end benchmark (tools/bench/e2e_device.sh, DL_ONLY), weight loading against the page-cache
# floor, the CUDA test suites, the product-path prefill/drafter benchmark and the GDN benchmark.
# Binaries (built here in the optimised test profile, stripped; the CLI xz-compressed to fit the
# 64 MiB transfer) in $B:
#   cargo build --profile test -p draftlens-cli && cp target/debug/draftlens $B/ && strip $B/draftlens && xz -9 $B/draftlens
#   cargo test --release ... --no-run for cuda_ops, cuda_decode, cuda_gdn; examples cuda_bench, gdn_bench
set -u
B=${1:-target-carry/final}
N=${2:-164}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
STEPS=${STEPS:-e2e tests bench}
has() { [[ " $STEPS " == *" $1 "* ]]; }
# Everything that travels is compressed: the tracked tree alone is 55 of the 64 MiB a call may send.
for f in "$B"/*.xz; do [ -e "$f" ] && xz -d "$f"; done
if [ -e "$B/tok.tar" ]; then
  mkdir -p data/prompts data/tokenizer && tar -xf "$B/tok.tar" -C /tmp && rm -rf data/tokenizer/qwen3-hf && mv /tmp/tokmin data/tokenizer/qwen3-hf
  mv "$B/humaneval.jsonl" data/prompts/
fi
chmod +x "$B"/* 2>/dev/null
if has e2e; then
# The transformers side too with DL_ONLY= (empty): both in one call, side by side.
DL_ONLY=${DL_ONLY-1} bash tools/bench/e2e_device.sh "$B" "$N"
echo "=== bench-load" | tee -a "$OUT/e2e.log"
timeout 60 "$B/draftlens" bench-load /tmp/q8b --backend cuda 2>&1 | tail -n 12 | tee -a "$OUT/e2e.log"
fi
has tests && for t in cuda_ops cuda_gdn cuda_decode; do
  echo "=== $t" | tee -a "$OUT/tests.log"
  timeout "${TEST_TIMEOUT:-100}" "$B/$t" --nocapture --test-threads=1 2>&1 | grep -v 'registers, ' > "$OUT/$t.log"
  grep -E '^test |test result' "$OUT/$t.log" | tee -a "$OUT/tests.log"
done
has bench || exit 0
echo "=== cuda_bench" | tee -a "$OUT/bench.log"
timeout 170 "$B/cuda_bench" --only ceilings,extract,drafter --out "$OUT/bench.json" 2>&1 | tee -a "$OUT/bench.log" | grep -E 'extract|DFlash|GEMM 8192|TargetModel' 
echo "=== gdn_bench" | tee -a "$OUT/bench.log"
timeout 60 "$B/gdn_bench" --seqs 4 2>&1 | grep -v 'registers, ' | tee -a "$OUT/bench.log" | tail -n 12
