#!/usr/bin/env bash
# The LM head fused with its top-K (issue 38 item 5; docs/cuda.md, "The LM head's top-K"), in one
# device call of about 4–6 minutes (steps can be run in separate calls: STEPS):
#   tests    cuda_lm_head, every test: the fused kernel against the CPU backend at 65, 300 and
#            4 097 rows, vocabularies 1 003 and 151 936, hidden 64 and 2 048, k = 1, 8, 16, 64
#            (random data under the tolerance rule; integer data and planted ties exactly), fused vs
#            unfused, ≤ 64 rows unchanged bit for bit, the hidden-size fallback; then cuda_decode's
#            LM-head and top-K tests with DRAFTLENS_LM_HEAD=fused (their 65- and 300-row cases then
#            run the fused kernel: exact ids on integer logits, top-1 against the decode path)
#   bench    cuda_bench --only lm-head: lm_head_topk at rows 4 096 / 16 384 × hidden 2 048 / 4 096,
#            vocab 151 936, k 8, fused vs unfused in one process: ms, TFLOP/s, fraction of the FLOP
#            floor (2·rows·vocab·hidden / 989 TFLOP/s), anchors/s at 15 rows per anchor, agreement
#   drafter  cuda_bench --only drafter (the product's DFlashDrafter over 4 096 anchors on random
#            Qwen3-8B-shaped weights: 7 680 LM-head rows per call) with DRAFTLENS_LM_HEAD=unfused,
#            then =fused: end-to-end anchors/s and the fraction of the drafter's FLOP floor
# The default stays unfused (crates/engine/src/backend/cuda/lm_head.rs) until this run decides.
# Build (build machine), then carry $B:
#   cargo test -p draftlens-engine --test cuda_lm_head --test cuda_decode --no-run   # prints the paths
#   cargo build --profile test -p draftlens-engine --example cuda_bench --features kernel-lab
#   mkdir -p target-carry/lmh && cp <cuda_lm_head exe> target-carry/lmh/cuda_lm_head && \
#     cp <cuda_decode exe> target-carry/lmh/cuda_decode && cp target/debug/examples/cuda_bench target-carry/lmh/ && \
#     strip target-carry/lmh/* && xz -T2 -6 target-carry/lmh/*
# Usage (device): run(command="B=target-carry/lmh bash tools/bench/lm_head_topk_device.sh", carry=["target-carry"])
#   STEPS="tests" / STEPS="bench drafter" to split it; LIMIT: seconds this call may take (560).
set -u
B=${B:-target-carry/lmh}
T0=$(date +%s)
source tools/bench/device_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
STEPS=${STEPS:-tests bench drafter}
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has tests; then
  s=$(date +%s)
  timeout 240 "$B/cuda_lm_head" --test-threads 1 --nocapture > "$O/cuda_lm_head.txt" 2>&1
  echo "== cuda_lm_head rc=$? $(( $(date +%s) - s )) s (total $(( $(date +%s) - T0 )) s)"
  grep -E "^test |test result|panicked|SKIP|within|ids" "$O/cuda_lm_head.txt" | head -80
  s=$(date +%s)
  DRAFTLENS_LM_HEAD=fused timeout 120 "$B/cuda_decode" --test-threads 1 --nocapture lm_head top_k \
    > "$O/cuda_decode_fused.txt" 2>&1
  echo "== cuda_decode (lm_head, top_k) with DRAFTLENS_LM_HEAD=fused rc=$? $(( $(date +%s) - s )) s"
  grep -E "^test |test result|panicked|SKIP" "$O/cuda_decode_fused.txt" | head -20
fi

if has bench; then
  s=$(date +%s)
  timeout $(( $(left) - 20 )) "$B/cuda_bench" --only lm-head --out "$OUT/lm_head_bench.json" > "$O/bench.txt" 2>&1
  echo "== cuda_bench --only lm-head rc=$? $(( $(date +%s) - s )) s"
  grep -E "device:|lm_head_topk|error|Error" "$O/bench.txt" | head -20
fi

if has drafter; then
  for mode in unfused fused; do
    if [ "$(left)" -lt 90 ]; then echo "== skip drafter $mode: $(left) s left"; continue; fi
    s=$(date +%s)
    DRAFTLENS_LM_HEAD=$mode timeout $(( $(left) - 20 )) "$B/cuda_bench" --only drafter \
      --out "$OUT/drafter_$mode.json" > "$O/drafter_$mode.txt" 2>&1
    echo "== cuda_bench --only drafter, DRAFTLENS_LM_HEAD=$mode rc=$? $(( $(date +%s) - s )) s"
    grep -E "DFlashDrafter|error|Error" "$O/drafter_$mode.txt" | head -5
  done
fi
cp "$O"/*.txt "$OUT"/ 2>/dev/null
echo "== total $(( $(date +%s) - T0 )) s"
