#!/usr/bin/env bash
# Session 12 device call: tests, decode bench, kernel trace, 8B run cold + cached.
set -u
B=target-carry/s12
O=/tmp/o; mkdir -p $O
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DRAFTLENS_KERNEL_CACHE=/tmp/dk
STEPS=${STEPS:-"tests bench trace run"}
has() { [[ " $STEPS " == *" $1 "* ]]; }
for f in $B/*.xz; do [ -e "${f%.xz}" ] || xz -dk "$f"; done
chmod +x $B/cuda_decode $B/cuda_ops $B/cuda_bench $B/draftlens 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
if has tests; then
  timeout 240 $B/cuda_decode --nocapture --test-threads=1 > $O/decode_tests.log 2>&1; echo "cuda_decode rc=$?"
  grep -E "^test |test result|panicked" $O/decode_tests.log | tail -20
  timeout 150 $B/cuda_ops --nocapture --test-threads=1 > $O/ops_tests.log 2>&1; echo "cuda_ops rc=$?"
  grep -E "test result|panicked|FAILED" $O/ops_tests.log | tail -5
fi
if has bench; then
  DECODE_ALONE=4 timeout 200 $B/cuda_bench --only decode > $O/bench.log 2>&1; echo "bench rc=$?"
  grep -iE "batch|step|greedy|GB/s" $O/bench.log | head -40
fi
if has trace; then
  bash tools/bench/kernel_trace.sh $O/trace.txt $B/cuda_bench --only decode --quick > /dev/null 2>&1
  python3 tools/bench/kernel_trace.py $O/trace.txt around decode_attention_hd128 --nth 40 > $O/layer-batch1.txt
  python3 tools/bench/kernel_trace.py $O/trace.txt durations topk_ > $O/topk-durations.txt
  python3 tools/bench/kernel_trace.py $O/trace.txt durations rms_norm_rows > $O/rms-durations.txt
  python3 tools/bench/kernel_trace.py $O/trace.txt durations decode_attention_hd128 > $O/attention-durations.txt
  cat $O/layer-batch1.txt; head -3 $O/topk-durations.txt $O/rms-durations.txt
  rm -f $O/trace.txt
fi
if has run; then
  tar -xJf $B/tok.tar.xz -C /tmp && mkdir -p data/tokenizer && rm -rf data/tokenizer/qwen3-hf && mv /tmp/tokmin data/tokenizer/qwen3-hf
  timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make.log 2>&1; echo "make rc=$?"
  for r in cold cached; do
    /usr/bin/time -v timeout 200 $B/draftlens run --backend cuda --target /tmp/q8b --drafter /tmp/q8b-drafters \
      --prompts builtin:humaneval --limit 164 --json --timeline > $O/run_$r.json 2> $O/run_$r.err
    echo "run $r rc=$?"; grep -E "wall|Maximum resident|Elapsed" $O/run_$r.err | head -5
    sync; sleep 2
  done
  grep -A40 -i "timeline" $O/run_cold.err | head -50
fi
tar czf $OUT/all.tgz -C $O .
