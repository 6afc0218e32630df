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
# The hybrids (issue 12): fla's engine-profile goldens and the CUDA profiles against them
# (tools/golden/fla_device.sh; the wheels in $B/fla, the test binary as $B/cuda_fla_golden), then
# `parity` of CPU vs CUDA reference/engine and `generate` with the default (auto) backend on the
# committed hybrid GGUF goldens, and `doctor` on a GPU machine.
if has fla; then
  FLA_WHEELS="$B/fla" FLA_TEST="$B/cuda_fla_golden" bash tools/golden/fla_device.sh > "$OUT/fla.log" 2>&1
  echo "=== fla rc=$?" | tee -a "$OUT/hybrid.log"
fi
if has hybrid; then
  printf '%s\n' '{"id": "r1", "prompt": "The quick brown fox jumps over the lazy dog because"}' \
    '{"id": "r2", "prompt": "def fibonacci(n):\n    "}' '{"id": "r3", "prompt": "Once upon a time in a small village"}' \
    '{"id": "r4", "prompt": "1, 2, 3, 5, 8, 13, 21,"}' > /tmp/raw.jsonl
  for m in qwen3_5 qwen3_next; do
    echo "=== generate (auto backend) $m" | tee -a "$OUT/hybrid.log"
    timeout 120 "$B/draftlens" generate --target tests/fixtures/golden/$m/model.gguf --prompts /tmp/raw.jsonl --max-new-tokens 8 2>&1 | head -n 3 | tee -a "$OUT/hybrid.log"
    echo "=== parity cpu,cuda $m" | tee -a "$OUT/hybrid.log"
    timeout 200 "$B/draftlens" parity --backends cpu,cuda --target tests/fixtures/golden/$m/model.gguf --prompts /tmp/raw.jsonl --max-new-tokens 16 > "$OUT/parity_$m.txt" 2>&1
    echo "rc=$?" | tee -a "$OUT/hybrid.log"; tail -n 40 "$OUT/parity_$m.txt" | tee -a "$OUT/hybrid.log"
  done
  echo "=== doctor" | tee -a "$OUT/hybrid.log"
  timeout 60 "$B/draftlens" doctor 2>&1 | tee -a "$OUT/hybrid.log"
fi
has bench || exit 0
echo "=== cuda_bench" | tee -a "$OUT/bench.log"
timeout 170 "$B/cuda_bench" --only ceilings,extract,drafter --out "$OUT/bench.json" 2>&1 | tee -a "$OUT/bench.log" | grep -E 'extract|DFlash|GEMM 8192|TargetModel' 
echo "=== gdn_bench" | tee -a "$OUT/bench.log"
timeout 60 "$B/gdn_bench" --seqs 4 2>&1 | grep -v 'registers, ' | tee -a "$OUT/bench.log" | tail -n 12
