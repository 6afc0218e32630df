#!/usr/bin/env bash
# Session 16, call 3 (target-carry/s16b: cuda_bench sampling the SM clock and board power through
# NVML while it times): flash attention alone against inside the product's packed prefill (2.3 ms
# per layer in the forward, 1.75 ms alone), and the product prefill at 1k, 2k, 4k and 8k tokens
# per sequence (16 384 tokens per forward each).
set -u
B=${B:-target-carry/s16b}
source tools/bench/device_env.sh
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make8.log 2>&1; echo "make8 rc=$?"
timeout 120 $B/cuda_bench --only attention > $O/attention.log 2>&1; echo "attention rc=$?"
grep -E "^attention|  attention" $O/attention.log
for s in 4x4096 16x1024 8x2048 2x8192; do
  timeout 120 $B/cuda_bench --only target --target /tmp/q8b --target-seqs $s > $O/target_$s.log 2>&1; echo "target $s rc=$?"
  grep -E "forward_packed|during" $O/target_$s.log
done
nvidia-smi -q -d POWER,CLOCK | grep -E "Power Limit|Max Clocks|SM  |Graphics" | head -12
tar czf $OUT/all.tgz -C $O .
