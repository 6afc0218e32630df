#!/usr/bin/env bash
# Session 16, call 8 (target-carry/s16d): the whole random Qwen3.6-27B's packed prefill (64 layers,
# 4 x 4096 tokens) with this session's kernels, both Gated DeltaNet profiles (issue 12's 70 % goal;
# session 10: reference 58.3 %, engine 63.9 %).
set -u
B=${B:-target-carry/s16d}
source tools/bench/device_env.sh
timeout 200 python3 tools/bench/make_random_target.py --arch qwen3.6-27b --out /dev/shm/q27full --taps 1,31,61 --drafters 0 > $O/make27.log 2>&1; echo "make27 rc=$?"
tail -1 $O/make27.log
timeout 300 $B/cuda_bench --only target --target /dev/shm/q27full --forwards 3 > $O/target27.log 2>&1; echo "target rc=$?"
grep -E "^target|forward_packed|during" $O/target27.log
tar czf $OUT/all.tgz -C $O .
