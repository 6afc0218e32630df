#!/usr/bin/env bash
# Session 13, call 3: the new CUDA test (split tap download, staged bf16 uploads), then the 8B
# `run` under the kernel trace with kernel_trace.py's per-transition report (what runs after each
# long idle), then the same job untraced with only the hidden-state and record caches emptied
# (kernels and GEMM choices warm), then the cached rerun.
set -u
B=target-carry/s13 DL_SHOW="Maximum resident|Elapsed"
source tools/bench/device_env.sh
timeout 120 $B/cuda_ops --test-threads=1 cuda_split_tap_download > $O/cuda_ops.log 2>&1; echo "cuda_ops rc=$?"; tail -n 4 $O/cuda_ops.log
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
dl_run q8b_traced /tmp/q8b /tmp/q8b-drafters bash tools/bench/kernel_trace.sh $O/q8b_trace.txt
python3 tools/bench/kernel_trace.py $O/q8b_trace.txt gaps - --top 30 > $O/q8b_gaps.txt
sed -n '/by transition/,/largest gaps/p' $O/q8b_gaps.txt | head -60
rm -f $O/q8b_trace.txt
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_warm /tmp/q8b /tmp/q8b-drafters
sed -n '/timeline:/,/Command being/p' $O/q8b_warm.err | head -45
sync; sleep 2
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_cached /tmp/q8b /tmp/q8b-drafters
grep "timeline:" $O/q8b_cached.err
find $O -size +3M -delete; rm -f $O/*.json
tar czf $OUT/all.tgz -C $O .
