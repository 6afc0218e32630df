#!/usr/bin/env bash
# Session 15, call 3 (target-carry/s15b: call 2's binaries plus each weight chunk's mapped pages
# dropped once copied, `raw::release_mapped_pages`; the q/k norm rewrite reverted): host memory of
# the 8B `run` (3 checkpoints) and of the whole Qwen3.6-27B `run` (1 checkpoint), each from an
# empty kernel cache; the raw-upload bit test (now also from a file mapping); and, if the image has
# Nsight Compute, why the top-K scan and the prefill's q/k norm + RoPE stay near 1.5 TB/s.
set -u
B=${B:-target-carry/s15b} DL_SHOW="timeline:|Maximum resident"
source tools/bench/device_env.sh
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
DRAFTLENS_KERNEL_CACHE=/tmp/dkcold8 dl_run q8b_cold /tmp/q8b /tmp/q8b-drafters
grep -E "identity|kernel compile|load target|drafter LM|besides" $O/q8b_cold.err
timeout 150 $B/cuda_ops --test-threads=1 cuda_raw_upload cuda_every_op > $O/ops_tests.log 2>&1; echo "cuda_ops rc=$?"
grep -E "test result|panicked" $O/ops_tests.log | tail -3
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
echo "ncu: ${NCU:-none}"
if [ -n "$NCU" ]; then
  S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
  timeout 150 $NCU --kernel-name regex:topk_logsoftmax --launch-skip 3 --launch-count 1 $S $B/cuda_bench --only drafter > $O/ncu_topk.txt 2>&1; echo "ncu topk rc=$?"
  grep -vE "^==PROF==|^\s*$|^ *-+ *-+" $O/ncu_topk.txt | sed -n '/topk_logsoftmax/,$p' | head -70
  timeout 150 $NCU --kernel-name regex:qk_norm_rope_vec --launch-skip 5 --launch-count 1 $S $B/cuda_bench --only target --target /tmp/q8b > $O/ncu_qk.txt 2>&1; echo "ncu qk rc=$?"
  grep -vE "^==PROF==|^\s*$|^ *-+ *-+" $O/ncu_qk.txt | sed -n '/qk_norm_rope_vec/,$p' | head -70
fi
rm -rf /tmp/q8b /tmp/q8b-drafters /tmp/dlc8
M=/tmp/q27full; [ "$(df --output=avail -B1G /dev/shm | tail -n 1)" -ge 60 ] && M=/dev/shm/q27full
export DRAFTLENS_CACHE=/tmp/dlc27
timeout 240 python3 tools/bench/make_random_target.py --arch qwen3.6-27b --out $M --taps 1,31,61 --drafters 1 > $O/make27.log 2>&1; echo "make27 rc=$?"
DRAFTLENS_KERNEL_CACHE=/tmp/dkcold27 dl_run q27_cold $M $M-drafters
grep -E "identity|kernel compile|load target|besides" $O/q27_cold.err
rm -f $O/*.json; find $O -size +3M -delete
tar czf $OUT/all.tgz -C $O .
