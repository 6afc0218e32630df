#!/usr/bin/env bash
# Session 17, call 3 (target-carry/s17c): the hybrids' memory-bound kernels in faster forms with the
# same bits: the zero-centred RMSNorm of ≤ 256-column groups one warp per group (the gated
# attention's q/k heads were one 256-thread block per 256 values), the row norms' loops unrolled,
# the gated RMSNorm's loads hoisted, the sigmoid gate 8 values per thread.
#  1. cuda_gdn (the new bit-for-bit test and the rest);
#  2. gdn_bench --breakdown, old and new binary (the per-op table of one GDN layer);
#  3. the 16-layer random Qwen3.6-27B's packed prefill (4 x 4096 tokens), old and new binary twice
#     each, alternating.
set -u
B=${B:-target-carry/s17c}
source tools/bench/device_env.sh
timeout 200 $B/cuda_gdn --test-threads=1 > $O/cuda_gdn.log 2>&1; echo "cuda_gdn rc=$?"
grep -E "test result|FAILED|panicked" $O/cuda_gdn.log | head
for v in old new; do
  bin=$B/gdn_bench; [ $v = old ] && bin=$B/gdn_bench_old
  timeout 60 $bin --seqs 4 --reps 5 --breakdown > $O/gdn_breakdown_$v.log 2>&1; echo "gdn_bench $v rc=$?"
  grep -E "norm|SwiGLU|split|conv|sum of|mixer" $O/gdn_breakdown_$v.log | head -20
done
[ -e /tmp/q27/config.json ] || { timeout 120 python3 tools/bench/make_random_target.py --arch qwen3.6-27b-16l --out /tmp/q27 --taps 1,9,15 --drafters 0 > $O/make27.log 2>&1; echo "make27 rc=$?"; }
for v in old new old new; do
  bin=$B/cuda_bench; [ $v = old ] && bin=$B/cuda_bench_old
  TARGET_DEFAULTS_ONLY=1 timeout 120 $bin --only target --target /tmp/q27 --forwards 3 >> $O/target27_$v.log 2>&1; echo "target $v rc=$?"
  grep -E "forward_packed" $O/target27_$v.log | tail -2
done
tar czf $OUT/all.tgz -C $O .
