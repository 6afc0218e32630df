#!/usr/bin/env bash
# Session 14, call 3 (target-carry/s14b: call 2's binaries plus 256 anchors per drafter forward by
# default): the 8B `run` of 3 checkpoints on a fresh machine (NVRTC and GEMM choices cold), again
# with kernels warm and only the hidden-state and record caches emptied, the same under the kernel
# trace (where the GPU time and the idle go), then cached. 164 HumanEval prompts, 128 new tokens.
set -u
B=target-carry/s14b DL_SHOW="timeline:|Maximum resident"
source tools/bench/device_env.sh
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
dl_run q8b_cold /tmp/q8b /tmp/q8b-drafters
grep -E "identity|kernel compile|gemm tuning|drafter" $O/q8b_cold.err
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_warm /tmp/q8b /tmp/q8b-drafters
sed -n '/timeline:/,/Command being/p' $O/q8b_warm.err | sed -n '2,36p'
sync; sleep 2
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_cached /tmp/q8b /tmp/q8b-drafters
rm -rf /tmp/dlc8c; mkdir -p /tmp/dlc8c && cp -r /tmp/dlc8/identity /tmp/dlc8c/
DRAFTLENS_CACHE=/tmp/dlc8c dl_run q8b_traced /tmp/q8b /tmp/q8b-drafters bash tools/bench/kernel_trace.sh $O/q8b_trace.txt
python3 tools/bench/kernel_trace.py $O/q8b_trace.txt kernels - --top 30 > $O/q8b_kernels.txt
python3 tools/bench/kernel_trace.py $O/q8b_trace.txt gaps - --top 30 > $O/q8b_gaps.txt
cat $O/q8b_kernels.txt; head -45 $O/q8b_gaps.txt
rm -f $O/q8b_trace.txt $O/*.json; find $O -size +3M -delete
tar czf $OUT/all.tgz -C $O .
