#!/usr/bin/env bash
# Session 27, call 3 (issue 38 item 6, cold start), on a fresh machine: a random Qwen3-8B folder
# built here; tools/bench/cold_identity_device.sh (the machine's first extract, weights evicted,
# empty kernel cache: the shipped kernel images and GEMM choices; then one round of cold extracts
# with the hash in the foreground and in the background); the shipped kernel images against NVRTC
# (empty kernel caches, weights in the page cache); then the transformers script from cold
# (weights evicted) at batch 64 and, time left, batch 32, in the same call.
#   B=target-carry/s27c bash docs/bench-logs/s27-2026-12-07/scripts/call3.sh
set -u
B=${B:-target-carry/s27c}
T0=$(date +%s)
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
ROUNDS=1 OUT=$OUT/cold timeout 330 bash tools/bench/cold_identity_device.sh "$B" 164 > /dev/null 2>&1
echo "== cold rc=$? $(( $(date +%s) - T0 )) s"
grep -E "^=== |wall_s=|cache read|weights hash|load target|kernel compile|gemm tuning|generate: |target forward|timeline:|identity:|rc=" $OUT/cold/cold.log | head -70
for images in shipped nvrtc; do
  rm -rf /tmp/dk-$images /tmp/c-$images
  s=$(date +%s%N)
  DRAFTLENS_KERNEL_IMAGES=$images DRAFTLENS_KERNEL_CACHE=/tmp/dk-$images \
    timeout 120 $B/draftlens extract --backend cuda --target /tmp/q8b --prompts builtin:humaneval --limit 164 \
    --layers 1,9,17,25,33 --cache-dir /tmp/c-$images --json --timeline > $O/images_$images.out 2> $O/images_$images.err
  echo "== extract, kernel images $images rc=$? $(( ($(date +%s%N) - s) / 1000000 )) ms"
  grep -E "timeline:|kernel compile|gemm tuning|load target|weights hash" $O/images_$images.err | head -5
done
for b in 64 32; do
  left=$(( 570 - ($(date +%s) - T0) ))
  [ $left -lt 100 ] && { echo "== hf batch $b skipped: $left s left"; continue; }
  sync; (echo 3 > /proc/sys/vm/drop_caches) 2> /dev/null || for f in /tmp/q8b/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done
  s=$(date +%s)
  timeout $(( left - 10 )) /usr/bin/time -f "wall_s=%e" python3 tools/bench/hf_e2e.py --model /tmp/q8b --prompts crates/engine/builtin-prompts/humaneval.jsonl --limit 164 --layers 1,9,17,25,33 --max-new 128 --batch $b --out /tmp/hf_out_$b > $O/hf_b$b.out 2> $O/hf_b$b.err
  echo "== hf batch $b (weights evicted) rc=$? $(( $(date +%s) - s )) s"; tail -1 $O/hf_b$b.out; tail -1 $O/hf_b$b.err
done
cp -r $OUT/cold $O/ 2>/dev/null; rm -f $O/cold/*.out
tar czf $OUT/s27c.tgz -C $O .
echo "== done $(( $(date +%s) - T0 )) s"
# After the measurements: the Gated DeltaNet suite on the shipped gdn image, and cuda_ops (the
# norm's loads issued ahead: its bit-for-bit tests against the other norm kernels).
mkdir -p /work && for d in /work/main /work/relsrc; do [ -e $d ] || ln -sfn "$PWD" $d; done
for t in cuda_gdn cuda_ops; do
  [ -e $B/$t ] || continue
  s=$(date +%s); timeout ${TEST_LIMIT:-100} $B/$t --test-threads 1 > $OUT/$t.txt 2>&1
  echo "== $t rc=$? $(( $(date +%s) - s )) s"; grep -E "test result|FAILED|panicked" $OUT/$t.txt | head -8
done
