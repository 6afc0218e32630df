#!/usr/bin/env bash
# Session 14, call 2 (target-carry/s14: the top-K scan in float4 groups, the timeline's new
# sub-phases and host memory besides queued cache writes, taps kept on the device between a
# run's target pass and its checkpoints' drafters): the top-K and decode tests, the
# product's packed prefill, drafter scoring and decode step in cuda_bench (Qwen3-8B shapes), where
# the prefill's GPU time goes (kernel_trace kernels), then the 8B `run` of 3 checkpoints from
# nothing and again with kernels warm (164 HumanEval prompts, 128 new tokens).
set -u
B=target-carry/s14 DL_SHOW="timeline:|Maximum resident"
source tools/bench/device_env.sh
timeout 150 $B/cuda_decode --test-threads=1 top_k batched_greedy > $O/decode_tests.log 2>&1; echo "cuda_decode rc=$?"
grep -E "test result|panicked" $O/decode_tests.log | tail -4
timeout 150 $B/cuda_ops --test-threads=1 cuda_drafter_blocks cuda_every_op > $O/ops_tests.log 2>&1; echo "cuda_ops rc=$?"
grep -E "test result|panicked" $O/ops_tests.log | tail -4
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
DECODE_ALONE=4 timeout 200 $B/cuda_bench --only target,drafter,decode --target /tmp/q8b > $O/bench.log 2>&1; echo "bench rc=$?"
grep -E "floor|anchors|decode step|lm_head|greedy" $O/bench.log | head -24
timeout 100 bash tools/bench/kernel_trace.sh $O/prefill_trace.txt $B/cuda_bench --only target --target /tmp/q8b > /dev/null 2>&1
python3 tools/bench/kernel_trace.py $O/prefill_trace.txt kernels - --top 25 > $O/prefill_kernels.txt; cat $O/prefill_kernels.txt
rm -f $O/prefill_trace.txt
export DRAFTLENS_CACHE=/tmp/dlc8
dl_run q8b_cold /tmp/q8b /tmp/q8b-drafters
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_warm /tmp/q8b /tmp/q8b-drafters
sed -n '/timeline:/,/Command being/p' $O/q8b_warm.err | sed -n '2,36p'
grep -o '"contexts_from_device": *[0-9]*' $O/q8b_warm.json
rm -f $O/*.json; find $O -size +3M -delete
tar czf $OUT/all.tgz -C $O .
