#!/usr/bin/env bash
# Session 16, call 4 (target-carry/s16c): the row-norm kernels against the grouped kernel bit for
# bit (new many-rows kernel), the cuBLASLt candidates of the four Qwen3-8B prefill GEMMs (16 384
# rows) under sustained load against the tuner's burst choice (`cuda_bench --only
# gemm-sustained`, twice), and the product prefill with the many-rows norm and the q norm inside
# flash_attention2 (A/B against the separate pass in the same run).
set -u
B=${B:-target-carry/s16c}
source tools/bench/device_env.sh
timeout 120 $B/cuda_ops --test-threads=1 row_norm swiglu_rows fused_trait q_norm_inside cuda_every_op 2>&1 | grep -E "^test |test result|panicked|differ"
[ -d /tmp/q8b ] || { timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make8.log 2>&1; echo "make8 rc=$?"; }
for r in 1 2; do
  timeout 200 $B/cuda_bench --only gemm-sustained > $O/sustained_$r.log 2>&1; echo "sustained $r rc=$?"
  grep -E "sustained ms|burst choice" $O/sustained_$r.log
done
timeout 120 $B/cuda_bench --only target --target /tmp/q8b > $O/target.log 2>&1; echo "target rc=$?"
grep -E "forward_packed|during" $O/target.log
timeout 100 bash tools/bench/kernel_trace.sh $O/pt.txt $B/cuda_bench --only target --target /tmp/q8b --forwards 2 > /dev/null 2>&1
python3 tools/bench/kernel_trace.py $O/pt.txt kernels - --top 14 | tee $O/prefill_kernels.txt
rm -f $O/pt.txt*
tar czf $OUT/all.tgz -C $O .
