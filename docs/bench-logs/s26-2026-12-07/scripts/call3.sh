#!/usr/bin/env bash
# Session 26, call 3 (issue 38 item 6, cold start): a random Qwen3-8B folder built here; the first
# extract of a fresh machine, then cold extracts with the weights hash in the foreground and in the
# background (tools/bench/cold_identity_device.sh), then the transformers script on the same folder
# in the same call (tools/bench/hf_e2e.py, batch 64 and 32: its best and the issue's); between them
# the shipped kernel images against NVRTC (DRAFTLENS_KERNEL_IMAGES=nvrtc), empty kernel caches.
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
# The shipped kernel images against NVRTC on this machine: the same extract, weights in the page
# cache, each with an empty kernel cache and a fresh hidden-state cache, alternating.
for round in 1 2; do
  for images in shipped nvrtc; do
    rm -rf /tmp/dk-$images /tmp/c-$images
    s=$(date +%s%N)
    DRAFTLENS_KERNEL_IMAGES=$([ $images = nvrtc ] && echo nvrtc || echo shipped) DRAFTLENS_KERNEL_CACHE=/tmp/dk-$images \
      timeout 120 $B/draftlens extract --backend cuda --target /tmp/q8b --prompts builtin:humaneval --limit 164 \
      --layers 1,9,17,25,33 --cache-dir /tmp/c-$images --json --timeline > $OUT/images_${images}_$round.out 2> $OUT/images_${images}_$round.err
    echo "== extract, kernel images $images (round $round) rc=$? $(( ($(date +%s%N) - s) / 1000000 )) ms"
    grep -E "kernel compile|gemm tuning|load target|total" $OUT/images_${images}_$round.err | head -4
  done
done
for b in 64 32; do
  left=$(( 560 - ($(date +%s) - T0) ))
  [ $left -lt 90 ] && { echo "== hf batch $b skipped: $left s left"; continue; }
  s=$(date +%s)
  timeout $(( left - 10 )) /usr/bin/time -f "wall_s=%e" python3 tools/bench/hf_e2e.py --model /tmp/q8b --prompts crates/engine/builtin-prompts/humaneval.jsonl --limit 164 --max-new 128 --batch $b --out /tmp/hf_out_$b > $OUT/hf_b$b.out 2> $OUT/hf_b$b.err
  echo "== hf batch $b rc=$? $(( $(date +%s) - s )) s"; tail -1 $OUT/hf_b$b.out; tail -1 $OUT/hf_b$b.err
done
echo "== done $(( $(date +%s) - T0 )) s"
