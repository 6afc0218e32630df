#!/usr/bin/env bash
# Session 16, call 6 (target-carry/s16d, call 5's build): the product prefill at 1k, 2k, 4k and
# 8k tokens per sequence (16 384 tokens per forward each), with the q norm inside flash_attention2
# and the separate pass side by side, the SM clock and power sampled.
set -u
B=${B:-target-carry/s16d}
source tools/bench/device_env.sh
[ -d /tmp/q8b ] || { timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make8.log 2>&1; echo "make8 rc=$?"; }
for s in 16x1024 8x2048 4x4096 2x8192; do
  timeout 120 $B/cuda_bench --only target --target /tmp/q8b --target-seqs $s > $O/target_$s.log 2>&1; echo "target $s rc=$?"
  grep -E "forward_packed|during" $O/target_$s.log
done
tar czf $OUT/all.tgz -C $O .
