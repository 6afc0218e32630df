#!/usr/bin/env bash
# Session 16, call 1 (target-carry/s15c, session 15's final kernels): where the product prefill
# (`TargetModel::forward_packed`, 4 x 4096 tokens of a random Qwen3-8B) and a decode step leave the
# GPU idle. Kernel traces of `cuda_bench --only target` and `--only decode`, read with
# kernel_trace.py gaps / around.
set -u
B=${B:-target-carry/s15c}
source tools/bench/device_env.sh
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make8.log 2>&1; echo "make8 rc=$?"
tail -2 $O/make8.log
timeout 150 bash tools/bench/kernel_trace.sh $O/pt.txt $B/cuda_bench --only target --target /tmp/q8b --forwards 3
grep -E "forward_packed" $O/pt.txt.stdout
python3 tools/bench/kernel_trace.py $O/pt.txt gaps - --top 30 --min-us 3 > $O/prefill_gaps.txt; head -70 $O/prefill_gaps.txt
python3 tools/bench/kernel_trace.py $O/pt.txt around flash_attention2 --nth 50 --before 12 --after 12 > $O/prefill_layer.txt; cat $O/prefill_layer.txt
python3 tools/bench/kernel_trace.py $O/pt.txt kernels - --top 20 > $O/prefill_kernels.txt; cat $O/prefill_kernels.txt
rm -f $O/pt.txt
DECODE_ALONE=2 timeout 200 bash tools/bench/kernel_trace.sh $O/dt.txt $B/cuda_bench --only decode --target /tmp/q8b
grep -E "decode step|step" $O/dt.txt.stdout | head -12
python3 tools/bench/kernel_trace.py $O/dt.txt gaps - --top 30 --min-us 2 > $O/decode_gaps.txt; head -60 $O/decode_gaps.txt
python3 tools/bench/kernel_trace.py $O/dt.txt around topk_merge --nth 30 --before 30 --after 2 > $O/decode_b1.txt; cat $O/decode_b1.txt
rm -f $O/dt.txt
tar czf $OUT/all.tgz -C $O .
