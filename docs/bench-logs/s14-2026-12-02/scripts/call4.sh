#!/usr/bin/env bash
# Session 14, call 4 (target-carry/s14c: call 3's binaries plus the top-K scan's group skip and
# __expf, malloc_trim after each NVRTC compile, a record queue of 32 prompts): the top-K tests,
# then the 8B `run` of 3 checkpoints on a fresh machine, again with kernels warm (only the
# hidden-state and record caches emptied), and that again under the kernel trace.
# Call 6 is this script with B=target-carry/s14d (call6.sh).
set -u
B=${B:-target-carry/s14c} DL_SHOW="timeline:|Maximum resident"
source tools/bench/device_env.sh
timeout 120 $B/cuda_decode --test-threads=1 top_k > $O/decode_tests.log 2>&1; echo "cuda_decode rc=$?"
grep -E "test result|panicked" $O/decode_tests.log | tail -3
timeout 120 $B/cuda_ops --test-threads=1 cuda_drafter_blocks cuda_every_op > $O/ops_tests.log 2>&1; echo "cuda_ops rc=$?"
grep -E "test result|panicked" $O/ops_tests.log | tail -3
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
dl_run q8b_cold /tmp/q8b /tmp/q8b-drafters
grep -E "identity|kernel compile|gemm tuning|drafter" $O/q8b_cold.err
sync; sleep 3
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_warm /tmp/q8b /tmp/q8b-drafters
sed -n '/timeline:/,/Command being/p' $O/q8b_warm.err | sed -n '2,36p'
sync; sleep 3
rm -rf /tmp/dlc8c; mkdir -p /tmp/dlc8c && cp -r /tmp/dlc8/identity /tmp/dlc8c/
DRAFTLENS_CACHE=/tmp/dlc8c dl_run q8b_traced /tmp/q8b /tmp/q8b-drafters bash tools/bench/kernel_trace.sh $O/q8b_trace.txt
python3 tools/bench/kernel_trace.py $O/q8b_trace.txt kernels - --top 20 > $O/q8b_kernels.txt
python3 tools/bench/kernel_trace.py $O/q8b_trace.txt gaps - --top 30 > $O/q8b_gaps.txt
cat $O/q8b_kernels.txt; head -30 $O/q8b_gaps.txt
rm -f $O/q8b_trace.txt $O/*.json; find $O -size +3M -delete
tar czf $OUT/all.tgz -C $O .
