#!/usr/bin/env bash
# Session 17, call 1 (target-carry/s17a): the decode attention with one wave of blocks (several key
# chunks per block when a step has many sequences) and cp.async tile copies.
#  0. cuda_ops (the q/k norm + RoPE arithmetic now one definition in common.cuh: the kernels that
#     must agree bit for bit are compared against each other and the CPU);
#  1. cuda_decode: batch invariance, 1–3 blocks per sequence, the fused q/k norm route;
#  2. cuda_bench --only decode (model steps) as built, then with one block per chunk (the old
#     scheduling, DECODE_ATTN_BLOCKS=128) for the A/B of whole steps;
#  3. `draftlens generate` of 64 HumanEval prompts × 128 tokens on a random Qwen3-8B (kept in /tmp
#     for call 2, which runs session 15's binary on the same model and compares the texts);
#  4. a kernel trace of the decode steps (one layer at batch 1 and at 64).
set -u
B=${B:-target-carry/s17a}
source tools/bench/device_env.sh
timeout 240 $B/cuda_ops --test-threads=1 > $O/cuda_ops.log 2>&1; echo "cuda_ops rc=$?"
grep -E "test result|FAILED|panicked" $O/cuda_ops.log | head
timeout 200 $B/cuda_decode --test-threads=1 > $O/cuda_decode.log 2>&1; echo "cuda_decode rc=$?"
grep -E "test result|FAILED|panicked|split-KV|fused decode qkv .*×128, rotary 128" $O/cuda_decode.log | head -20
DECODE_SECTIONS=model DECODE_ALONE=2 timeout 150 $B/cuda_bench --only decode > $O/decode.log 2>&1; echo "decode rc=$?"
grep -E "decode step|greedy|copy|decode attention" $O/decode.log
DECODE_ATTN_BLOCKS=128 DECODE_SECTIONS=model DECODE_ALONE=2 timeout 150 $B/cuda_bench --only decode > $O/decode_per_chunk.log 2>&1; echo "decode per-chunk rc=$?"
grep -E "decode step|greedy" $O/decode_per_chunk.log
python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make.log 2>&1; echo "make rc=$?"
DRAFTLENS_DATA=/tmp/data-new DRAFTLENS_CACHE=/tmp/cache-new /usr/bin/time -f "%e s %M KB" timeout 200 $B/draftlens generate --backend cuda \
  --target /tmp/q8b --prompts builtin:humaneval --limit 64 --max-new-tokens 128 --json > /tmp/gen_new.json 2> $O/gen_new.err
echo "generate new rc=$?"; tail -1 $O/gen_new.err; cp /tmp/gen_new.json $O/
python3 -c 'import json, hashlib; a = json.load(open("/tmp/gen_new.json")); print("texts sha256 (new):", hashlib.sha256("\x00".join(x["text"] for x in a).encode()).hexdigest(), sum(x["new_tokens"] for x in a), "new tokens")' 
DECODE_SECTIONS=model DECODE_ALONE=1 timeout 200 bash tools/bench/kernel_trace.sh $O/dt.txt $B/cuda_bench --only decode > /dev/null 2>&1
for n in 3 36; do python3 tools/bench/kernel_trace.py $O/dt.txt around topk_partial --nth $n --before 44 --after 3 > $O/step_$n.txt; head -12 $O/step_$n.txt; done
rm -f $O/dt.txt $O/dt.txt.stdout
tar czf $OUT/all.tgz -C $O .
