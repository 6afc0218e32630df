#!/usr/bin/env bash
# Session 15, call 3 (target-carry/s15): why the top-K scan reads its logits at ~1.5 TB/s and the
# prefill's q/k norm + RoPE runs at ~37 % of the copy rate: Nsight Compute, if the image has it,
# on one launch of each (the drafter section of cuda_bench needs no model; the target section
# runs on the random Qwen3-8B).
set -u
B=${B:-target-carry/s15}
source tools/bench/device_env.sh
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
echo "ncu: ${NCU:-none}"; ls /usr/local/cuda/ | head -30
[ -n "$NCU" ] || exit 0
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
timeout 200 $NCU --kernel-name regex:topk_logsoftmax --launch-skip 3 --launch-count 1 $SECTIONS $B/cuda_bench --only drafter > $O/ncu_topk.txt 2>&1; echo "ncu topk rc=$?"
grep -vE "^==PROF==|^\s*$" $O/ncu_topk.txt | sed -n '/topk_logsoftmax/,$p' | head -90
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make8.log 2>&1; echo "make8 rc=$?"
timeout 240 $NCU --kernel-name regex:qk_norm_rope_vec --launch-skip 5 --launch-count 1 $SECTIONS $B/cuda_bench --only target --target /tmp/q8b > $O/ncu_qk.txt 2>&1; echo "ncu qk rc=$?"
grep -vE "^==PROF==|^\s*$" $O/ncu_qk.txt | sed -n '/qk_norm_rope_vec/,$p' | head -90
tar czf $OUT/all.tgz -C $O .
