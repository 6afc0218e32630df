#!/usr/bin/env bash
# Session 15, call 2 (target-carry/s15: q/k norm + RoPE with all of a block's loads in flight, the
# top-K scan's warp-wide bound, NVRTC prewarm on four threads): the 8B `run` of 3 checkpoints on
# a fresh machine first (empty kernel cache: host memory while the compile overlaps the load),
# then the bit tests (q/k norm + RoPE fused vs split exact; top-K ids against the CPU on ties),
# the product's packed prefill and drafter in cuda_bench with its kernel trace, and the 8B `run`
# with kernels warm, then traced (164 HumanEval prompts, 128 new tokens).
set -u
B=${B:-target-carry/s15} DL_SHOW="timeline:|Maximum resident"
source tools/bench/device_env.sh
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
DRAFTLENS_KERNEL_CACHE=/tmp/dkcold dl_run q8b_cold /tmp/q8b /tmp/q8b-drafters
grep -E "identity|kernel compile|gemm tuning|drafter|besides" $O/q8b_cold.err
timeout 150 $B/cuda_decode --test-threads=1 top_k batched_greedy > $O/decode_tests.log 2>&1; echo "cuda_decode rc=$?"
grep -E "test result|panicked" $O/decode_tests.log | tail -3
timeout 150 $B/cuda_ops --test-threads=1 cuda_fused_trait_ops cuda_drafter_blocks cuda_every_op > $O/ops_tests.log 2>&1; echo "cuda_ops rc=$?"
grep -E "test result|panicked|fused vs split" $O/ops_tests.log | tail -6
timeout 200 $B/cuda_bench --only target,drafter --target /tmp/q8b > $O/bench.log 2>&1; echo "bench rc=$?"
grep -E "floor|anchors|q/k norm" $O/bench.log | head -12
timeout 120 bash tools/bench/kernel_trace.sh $O/prefill_trace.txt $B/cuda_bench --only target --target /tmp/q8b > /dev/null 2>&1
python3 tools/bench/kernel_trace.py $O/prefill_trace.txt kernels - --top 14 > $O/prefill_kernels.txt; cat $O/prefill_kernels.txt
rm -f $O/prefill_trace.txt
sync; sleep 2
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_KERNEL_CACHE=/tmp/dkcold DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_warm /tmp/q8b /tmp/q8b-drafters
sed -n '/timeline:/,/Command being/p' $O/q8b_warm.err | sed -n '2,36p'
sync; sleep 2
mkdir -p /tmp/dlc8c && cp -r /tmp/dlc8/identity /tmp/dlc8c/
DRAFTLENS_KERNEL_CACHE=/tmp/dkcold DRAFTLENS_CACHE=/tmp/dlc8c dl_run q8b_traced /tmp/q8b /tmp/q8b-drafters bash tools/bench/kernel_trace.sh $O/q8b_trace.txt
python3 tools/bench/kernel_trace.py $O/q8b_trace.txt kernels - --top 16 > $O/q8b_kernels.txt; cat $O/q8b_kernels.txt
rm -f $O/q8b_trace.txt $O/*.json; find $O -size +3M -delete
tar czf $OUT/all.tgz -C $O .
