#!/usr/bin/env bash
# Session 26, call 3 (issue 38 item 6, cold start): a random Qwen3-8B folder built here; the first
# extract of a fresh machine, then cold extracts with the weights hash in the foreground and in the
# background (tools/bench/cold_identity_device.sh), then the transformers script on the same folder
# in the same call (tools/bench/hf_e2e.py, batch 64 and 32: its best and the issue's).
#   B=target-carry/s26 bash docs/bench-logs/s26-2026-12-07/scripts/call3.sh
set -u
B=${B:-target-carry/s26}
T0=$(date +%s)
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
OUT=$OUT/cold timeout 400 bash tools/bench/cold_identity_device.sh "$B" 164 > /dev/null 2>&1
echo "== cold rc=$? $(( $(date +%s) - T0 )) s"
grep -E "^=== |wall_s=|cache read|weights hash|load target|kernel compile|gemm tuning|total|identity:|rc=" $OUT/cold/cold.log | head -80
cp /tmp/draftlens-kernels/gemm-choices-v1.json $OUT/ 2>/dev/null
for b in 64 32; do
  left=$(( 560 - ($(date +%s) - T0) ))
  [ $left -lt 90 ] && { echo "== hf batch $b skipped: $left s left"; continue; }
  s=$(date +%s)
  timeout $(( left - 10 )) /usr/bin/time -f "wall_s=%e" python3 tools/bench/hf_e2e.py --model /tmp/q8b --prompts crates/engine/builtin-prompts/humaneval.jsonl --limit 164 --max-new 128 --batch $b --out /tmp/hf_out_$b > $OUT/hf_b$b.out 2> $OUT/hf_b$b.err
  echo "== hf batch $b rc=$? $(( $(date +%s) - s )) s"; tail -1 $OUT/hf_b$b.out; tail -1 $OUT/hf_b$b.err
done
echo "== done $(( $(date +%s) - T0 )) s"
