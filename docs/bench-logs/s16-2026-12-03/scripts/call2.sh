#!/usr/bin/env bash
# Session 16, call 2 (target-carry/s16a: cuda_bench with the decode step's host-issue time and
# DECODE_SECTIONS=model): does the host keep up with a decode step (layers issued vs queued back to
# back vs synchronised step), one traced step's last layers at batch 1 and 64, and flash
# attention's rate alone today (the forward's 2.3 ms per layer is 238 TFLOP/s).
set -u
B=${B:-target-carry/s16a}
source tools/bench/device_env.sh
DECODE_SECTIONS=model DECODE_ALONE=2 timeout 150 $B/cuda_bench --only decode > $O/decode.log 2>&1; echo "decode rc=$?"
grep -E "decode step|greedy|copy" $O/decode.log
DECODE_SECTIONS=model DECODE_ALONE=1 timeout 200 bash tools/bench/kernel_trace.sh $O/dt.txt $B/cuda_bench --only decode
for n in 3 36; do python3 tools/bench/kernel_trace.py $O/dt.txt around topk_partial --nth $n --before 44 --after 3 > $O/step_$n.txt; cat $O/step_$n.txt; done
python3 tools/bench/kernel_trace.py $O/dt.txt gaps - --top 20 --min-us 2 | head -40 > $O/decode_gaps.txt; cat $O/decode_gaps.txt
rm -f $O/dt.txt $O/dt.txt.stdout
timeout 150 $B/cuda_bench --only attention > $O/attention.log 2>&1; echo "attention rc=$?"
grep -iE "flash|TFLOP" $O/attention.log | head -20
tar czf $OUT/all.tgz -C $O .
