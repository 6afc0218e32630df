#!/usr/bin/env bash
# Session 12, call 3: tests (cuda_decode, cuda_gdn), the decode bench, and a 16-layer Qwen3.6-27B
# `run` (64 prompts x 128 tokens) twice from an empty cache, and a kernel trace of one.
set -u
B=target-carry/s12; A=target-carry/s12a
O=/tmp/o; rm -rf $O; mkdir -p $O
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DRAFTLENS_KERNEL_CACHE=/tmp/dk
STEPS=${STEPS:-"tests bench hyb"}
has() { [[ " $STEPS " == *" $1 "* ]]; }
for f in $B/*.xz $A/*.xz; do [ -e "${f%.xz}" ] || xz -dk "$f"; done
chmod +x $B/* $A/* 2>/dev/null
if has tests; then
  timeout 200 $B/cuda_decode --nocapture --test-threads=1 > $O/decode_tests.log 2>&1; echo "cuda_decode rc=$?"
  grep -E "test result|panicked|fused decode" $O/decode_tests.log | tail -12
  timeout 200 $B/cuda_gdn --nocapture --test-threads=1 > $O/gdn_tests.log 2>&1; echo "cuda_gdn rc=$?"
  grep -E "test result|panicked" $O/gdn_tests.log | tail -5
fi
if has bench; then
  DECODE_ALONE=4 timeout 150 $B/cuda_bench --only decode > $O/bench.log 2>&1; echo "bench rc=$?"
  grep -E "decode step|greedy|lm_head" $O/bench.log | head -8
fi
if has hyb; then
  tar -xJf $B/tok.tar.xz -C /tmp && mkdir -p data/tokenizer && rm -rf data/tokenizer/qwen3-hf && mv /tmp/tokmin data/tokenizer/qwen3-hf
  [ -e /tmp/q27/config.json ] || { timeout 200 python3 tools/bench/make_random_target.py --arch qwen3.6-27b-16l --out /tmp/q27 --taps 1,7,14 --drafters 1 > $O/make27.log 2>&1; echo "make rc=$?"; }
  for v in B1 B2; do
    d=$B
    rm -rf /tmp/dlc; export DRAFTLENS_CACHE=/tmp/dlc
    /usr/bin/time -v timeout 200 $d/draftlens run --backend cuda --target /tmp/q27 --drafter /tmp/q27-drafters \
      --prompts builtin:humaneval --limit 64 --max-new-tokens 128 --json --timeline > $O/hyb_$v.json 2> $O/hyb_$v.err
    echo "run $v rc=$?"; grep -E "timeline:|generate: decode|generate: prefill|Maximum resident" $O/hyb_$v.err
  done
  rm -rf /tmp/dlc
  bash tools/bench/kernel_trace.sh /tmp/trace_h.txt $B/draftlens run --backend cuda --target /tmp/q27 --drafter /tmp/q27-drafters \
      --prompts builtin:humaneval --limit 64 --max-new-tokens 64 > /dev/null 2>&1
  python3 tools/bench/kernel_trace.py /tmp/trace_h.txt durations gdn_recurrent > $O/hyb_gdn_dur.txt
  python3 tools/bench/kernel_trace.py /tmp/trace_h.txt around gdn_recurrent --nth 300 --before 20 --after 40 > $O/hyb_step.txt
  head -3 $O/hyb_gdn_dur.txt; cat $O/hyb_step.txt | head -60
fi
tar czf $OUT/all.tgz -C $O .
