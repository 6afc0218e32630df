#!/usr/bin/env bash
# Session 15, call 4 (target-carry/s15c: call 3's binaries with the top-K scan on one sorted list
# per warp (warp-wide ballots, kernels/topk.cu topk_scan_warps) and a mapped part's pages dropped
# every 256 MiB copied instead of every 32 MiB): the top-K and raw-upload bit tests, the top-K
# kernel under Nsight Compute, the 8B `run` (3 checkpoints) on an empty kernel cache, with kernels
# warm, and traced, then the whole Qwen3.6-27B (1 checkpoint) on an empty kernel cache.
set -u
B=${B:-target-carry/s15c} DL_SHOW="timeline:|Maximum resident"
source tools/bench/device_env.sh
timeout 120 $B/cuda_decode --test-threads=1 top_k batched_greedy > $O/decode_tests.log 2>&1; echo "cuda_decode rc=$?"
grep -E "test result|panicked" $O/decode_tests.log | tail -3
timeout 120 $B/cuda_ops --test-threads=1 cuda_raw_upload cuda_drafter_blocks > $O/ops_tests.log 2>&1; echo "cuda_ops rc=$?"
grep -E "test result|panicked" $O/ops_tests.log | tail -3
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
if [ -n "$NCU" ]; then
  S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
  timeout 100 $NCU --kernel-name regex:topk_logsoftmax --launch-skip 3 --launch-count 1 $S $B/cuda_bench --only drafter > $O/ncu_topk.txt 2>&1; echo "ncu topk rc=$?"
  grep -E "Duration|DRAM Throughput|Compute \(SM\)|Memory Throughput|Active Threads|Issued Warp|anchors/s" $O/ncu_topk.txt | head -12
fi
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
dl_run q8b_cold /tmp/q8b /tmp/q8b-drafters
grep -E "identity|kernel compile|load target|drafter LM" $O/q8b_cold.err
sync; sleep 2
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_warm /tmp/q8b /tmp/q8b-drafters
sed -n '/timeline:/,/Command being/p' $O/q8b_warm.err | sed -n '2,36p'
mkdir -p /tmp/dlc8c && cp -r /tmp/dlc8/identity /tmp/dlc8c/
DRAFTLENS_CACHE=/tmp/dlc8c dl_run q8b_traced /tmp/q8b /tmp/q8b-drafters bash tools/bench/kernel_trace.sh $O/q8b_trace.txt
python3 tools/bench/kernel_trace.py $O/q8b_trace.txt kernels - --top 8 > $O/q8b_kernels.txt; cat $O/q8b_kernels.txt
rm -rf /tmp/q8b /tmp/q8b-drafters /tmp/dlc8* $O/q8b_trace.txt
M=/tmp/q27full; [ "$(df --output=avail -B1G /dev/shm | tail -n 1)" -ge 60 ] && M=/dev/shm/q27full
export DRAFTLENS_CACHE=/tmp/dlc27
timeout 240 python3 tools/bench/make_random_target.py --arch qwen3.6-27b --out $M --taps 1,31,61 --drafters 1 > $O/make27.log 2>&1; echo "make27 rc=$?"
DRAFTLENS_KERNEL_CACHE=/tmp/dkcold27 dl_run q27_cold $M $M-drafters
grep -E "identity|kernel compile|load target" $O/q27_cold.err
rm -f $O/*.json; find $O -size +3M -delete
tar czf $OUT/all.tgz -C $O .
