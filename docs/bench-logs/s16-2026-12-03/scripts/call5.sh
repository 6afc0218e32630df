#!/usr/bin/env bash
# Session 16, call 5 (target-carry/s16d): flash_attention2's q norm reading the block's (cos, sin)
# rows from shared memory (staged with Q's copy) instead of global memory; its bit-identity test
# and the fused-op tests, then the product prefill (q norm inside vs the separate pass, same run)
# and each variant's flash-attention and q/k-pass times from a kernel trace.
set -u
B=${B:-target-carry/s16d}
source tools/bench/device_env.sh
timeout 120 $B/cuda_ops --test-threads=1 row_norm swiglu_rows fused_trait q_norm_inside cuda_every_op 2>&1 | grep -E "^test |test result|panicked|differ"
[ -d /tmp/q8b ] || { timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make8.log 2>&1; echo "make8 rc=$?"; }
for r in 1 2; do
  timeout 120 $B/cuda_bench --only target --target /tmp/q8b > $O/target_$r.log 2>&1; echo "target rc=$?"
  grep -E "forward_packed|during" $O/target_$r.log
done
timeout 100 bash tools/bench/kernel_trace.sh $O/pt.txt $B/cuda_bench --only target --target /tmp/q8b --forwards 1 > /dev/null 2>&1
python3 tools/bench/kernel_trace.py $O/pt.txt kernels - --top 14 | tee $O/prefill_kernels.txt
for k in flash_attention2_hd128 qk_norm_rope_vec_bf16; do
  python3 tools/bench/kernel_trace.py $O/pt.txt durations $k > $O/dur_$k.txt
  python3 - $O/dur_$k.txt $k <<'PY'
import sys
v = [float(x) for line in open(sys.argv[1]) for x in line.split() if x.replace('.', '', 1).isdigit()]
print(sys.argv[2], len(v), "launches; mean us per block of 72:", [round(sum(v[i:i + 72]) / len(v[i:i + 72]), 1) for i in range(0, len(v), 72)])
PY
done
rm -f $O/pt.txt*
tar czf $OUT/all.tgz -C $O .
