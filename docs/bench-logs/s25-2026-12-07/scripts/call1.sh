#!/usr/bin/env bash
# Session 25, device call 1: session 24's call (gpt-oss on CUDA, issue 34) with the verify-as-decode
# tests (cuda_verify) first and, after the 20b-shaped run, live decoding A/B: the verify pass as
# decode steps (default) against DRAFTLENS_VERIFY=causal, 16 prompts, its divergences and times
# (issue 38 item 4). The tuned GEMM choices are copied out (issue 38 item 6).
#  1. GPU tests: cuda_sinks_windows (sinks and windows in both attention kernels vs the CPU, known
#     answers, decode rows alone vs batched), cuda_moe (gpt-oss's device-routed MoE, its kernels,
#     the gpt-oss golden on CUDA, batched gpt-oss greedy vs alone; the Qwen tests unchanged),
#     cuda_decode / cuda_attention / cuda_ops (the kernels changed under them).
#  2. A tiny gpt-oss end to end on CUDA and on the CPU: extract + run (1 DFlash checkpoint), τ of both.
#  3. gpt-oss-20b shapes (8 of 24 layers, random weights built here): extract cold / cached and run
#     (3 checkpoints) on 164 HumanEval prompts, against tools/bench/hf_e2e.py (eager attention:
#     transformers' gpt-oss has no SDPA path with sinks) in the same call; decode steps at batch 1.
#   B=target-carry/s25 O=$OUT/o bash docs/bench-logs/s25-2026-12-07/scripts/call1.sh
set -u
B=${B:-target-carry/s25}
T0=$(date +%s)
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /work && ln -sfn "$PWD" /work/main
# LIMIT: the seconds this call may take (the session's device time left); later steps are cut to it.
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
for t in ${TESTS:-cuda-verify cuda-sinks-windows cuda-moe cuda-decode cuda-attention}; do
  s=$(date +%s)
  timeout 90 "$B/$t" --test-threads 1 --nocapture > $OUT/$t.txt 2>&1
  echo "== $t rc=$? $(( $(date +%s) - s )) s (total $(( $(date +%s) - T0 )) s)"
  grep -E "^test .*(FAILED|ok)$|test result|panicked|greedy equals|last hidden|oracle τ" $OUT/$t.txt | grep -v "^test .* ok$" | head -30
done
export PYTHONUNBUFFERED=1
t() { local n=$1; shift; local s=$(date +%s%N); "$@" > $O/$n.out 2> $O/$n.err; local rc=$?; echo "== $n rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms"; grep -E "timeline|generate: |target forward|gemm tuning|kernel compile|cache read|error|Error" $O/$n.err | tail -6; }
# 2. tiny gpt-oss, CUDA against the CPU
python3 tools/bench/make_random_target.py --out /tmp/gt --arch gpt-oss-tiny --drafters 1 > $O/make-tiny.log 2>&1; tail -1 $O/make-tiny.log
for be in cuda cpu; do
  DRAFTLENS_DATA=/tmp/gd-$be DRAFTLENS_CACHE=/tmp/gc-$be t tiny_run_$be timeout 120 $B/draftlens --json run --backend $be --target /tmp/gt --drafter /tmp/gt-drafters --prompts builtin:humaneval --limit 16 --max-new-tokens 64 --db /tmp/gt-$be.sqlite
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], json.dumps(d)[:400])" $O/tiny_run_$be.out $be 2>&1 | head -3
done
echo "== before 20b: $(( $(date +%s) - T0 )) s"
# 3. gpt-oss-20b shapes, 8 layers
P=crates/engine/builtin-prompts/humaneval.jsonl
python3 tools/bench/make_random_target.py --out /tmp/g20 --arch gpt-oss-20b-8l --drafters 3 > $O/make.log 2>&1; tail -2 $O/make.log
cat /tmp/g20/*.safetensors > /dev/null
X="extract --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128 --timeline"
rm -rf /tmp/dk
DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cold timeout 150 $B/draftlens --json $X
DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cached timeout 60 $B/draftlens --json $X
DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_run3 timeout 150 $B/draftlens --json run --backend cuda --target /tmp/g20 --drafter /tmp/g20-drafters --prompts builtin:humaneval --limit 164 --max-new-tokens 128 --db /tmp/g20.sqlite
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:600])" $O/dl_run3.out 2>&1 | head -3
G="generate --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 8 --gen-batch 1 --max-new-tokens 128 --timeline"
DRAFTLENS_DATA=/tmp/d4 DRAFTLENS_CACHE=/tmp/c4 t gen_b1 timeout 60 $B/draftlens $G
$B/draftlens inspect /tmp/g20 --json > $O/inspect.json 2>&1
# Live decoding, verify as decode steps (default) vs the prefill-style verify: divergences and times.
D1=$(ls -d /tmp/g20-drafters/step-* | head -1)
L="live --backend cuda --target /tmp/g20 --drafter $D1 --prompts builtin:humaneval --limit 16 --max-new-tokens 128 --json"
DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t live_decode_steps timeout 90 $B/draftlens $L
DRAFTLENS_VERIFY=causal DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t live_causal timeout 90 $B/draftlens $L
for n in live_decode_steps live_causal; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); ps=d if isinstance(d,list) else d.get('prompts',[]); print(sys.argv[2], 'prompts', len(ps), 'lossless', sum(1 for p in ps if p.get('lossless')), 'mean tau', sum(p.get('tau',0) for p in ps)/max(1,len(ps)))" $O/$n.out $n 2>&1 | cut -c1-600
done
echo "== before hf: $(( $(date +%s) - T0 )) s"
t hf_run3 timeout $(left) python3 tools/bench/hf_e2e.py --model /tmp/g20 --prompts $P --limit 164 --layers 1,3,5,6 --max-new 128 --batch 32 --attn eager --out /tmp/hf_out --drafters /tmp/g20-drafters
tail -2 $O/hf_run3.out; tail -3 $O/hf_run3.err
cp /tmp/dk/gemm-choices-v1.json $OUT/ 2>/dev/null
tar czf $OUT/gpt-oss-e2e.tgz -C $O .
echo "== done $(( $(date +%s) - T0 )) s"
