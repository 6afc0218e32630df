#!/usr/bin/env bash
# Session 12, call 2: decode A/B (session 11's final cuda_bench vs this one), step traces at batch
# 1 and 64, cuda_decode, and a kernel trace of a 16-layer Qwen3.6-27B run's decode.
set -u
B=target-carry/s12; A=target-carry/s11e
O=/tmp/o; rm -rf $O; mkdir -p $O
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DRAFTLENS_KERNEL_CACHE=/tmp/dk
STEPS=${STEPS:-"ab tests trace hyb"}
has() { [[ " $STEPS " == *" $1 "* ]]; }
for f in $B/*.xz $A/*.xz; do [ -e "${f%.xz}" ] || xz -dk "$f"; done
chmod +x $B/* $A/* 2>/dev/null
if has ab; then
  for v in A B; do
    eval d=\$$v
    DECODE_ALONE=4 timeout 150 $d/cuda_bench --only decode > $O/bench_$v.log 2>&1; echo "bench $v rc=$?"
    grep -E "decode step|greedy|lm_head|attention, " $O/bench_$v.log | head -14
  done
fi
if has tests; then
  timeout 200 $B/cuda_decode --nocapture --test-threads=1 > $O/decode_tests.log 2>&1; echo "cuda_decode rc=$?"
  grep -E "test result|panicked" $O/decode_tests.log | tail -5
fi
if has trace; then
  for v in A B; do
    eval d=\$$v
    bash tools/bench/kernel_trace.sh /tmp/trace_$v.txt $d/cuda_bench --only decode --quick > /dev/null 2>&1
    python3 tools/bench/kernel_trace.py /tmp/trace_$v.txt durations decode_attention_hd128 > $O/attn_dur_$v.txt
    for n in 150 620; do
      python3 tools/bench/kernel_trace.py /tmp/trace_$v.txt around decode_attention_hd128 --nth $n --before 14 --after 16 > $O/layer_${v}_$n.txt
    done
  done
  head -40 $O/attn_dur_B.txt | awk 'NR%5==1'
  for n in 150 620; do echo "== $n A"; cat $O/layer_A_$n.txt; echo "== $n B"; cat $O/layer_B_$n.txt; done
fi
if has hyb; then
  tar -xJf $B/tok.tar.xz -C /tmp && mkdir -p data/tokenizer && rm -rf data/tokenizer/qwen3-hf && mv /tmp/tokmin data/tokenizer/qwen3-hf
  timeout 200 python3 tools/bench/make_random_target.py --arch qwen3.6-27b-16l --out /tmp/q27 --taps 1,7,14 --drafters 1 > $O/make27.log 2>&1; echo "make rc=$?"
  bash tools/bench/kernel_trace.sh /tmp/trace_h.txt $B/draftlens run --backend cuda --target /tmp/q27 --drafter /tmp/q27-drafters \
      --prompts builtin:humaneval --limit 64 --max-new-tokens 64 --timeline > $O/hyb_run.txt 2>&1
  python3 tools/bench/kernel_trace.py /tmp/trace_h.txt around gdn_recurrent --nth 300 --before 30 --after 60 > $O/hyb_step.txt
  python3 tools/bench/kernel_trace.py /tmp/trace_h.txt durations gdn_recurrent > $O/hyb_gdn_dur.txt
  cat $O/hyb_step.txt; head -3 $O/hyb_gdn_dur.txt
fi
tar czf $OUT/all.tgz -C $O .
