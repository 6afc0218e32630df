#!/usr/bin/env bash
# Session 25 device calls (issues 34 and 38), in steps so that one call or two can carry them:
#   tests  GPU suites: cuda_verify (verify = decode steps, live = greedy), cuda_mxfp4 (MXFP4 kept
#          packed), cuda_moe, cuda_sinks_windows, cuda_decode, cuda_attention ($TESTS)
#   tiny   a tiny gpt-oss end to end on CUDA and on the CPU (run, 16 prompts), then live decoding
#          on CUDA with the verify pass as decode steps (default) and DRAFTLENS_VERIFY=causal:
#          prompts lossless of 16, τ, wall time
#   mx     tools/bench/mxfp4_packed_device.sh STEPS="make bench" (packed vs bf16 experts on a
#          gpt-oss-20b-shaped MXFP4 target: decode step at batch 1/64, load, peak memory)
#   e2e    gpt-oss-20b shapes (8 of 24 layers, bf16 experts): extract cold/cached, run (3
#          checkpoints) on 164 HumanEval prompts, generate at batch 1, live A/B on 16 prompts
#   hf     the transformers script on the same folder (eager attention: gpt-oss's sinks)
#   mem    tools/bench/moe_memory_device.sh (random:DIR targets: the 122B refused, then one 32k-token
#          prompt through Qwen3.5-35B-A3B in bf16 and gpt-oss-120b with MXFP4 experts kept packed)
#   B=target-carry/s25 STEPS="tests tiny mx" bash docs/bench-logs/s25-2026-12-07/scripts/call.sh
set -u
B=${B:-target-carry/s25}
T0=$(date +%s)
OUTDIR=$OUT
O=$OUTDIR/o
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUTDIR/gpu.txt
mkdir -p /work && ln -sfn "$PWD" /work/main
LIMIT=${LIMIT:-560}
STEPS=${STEPS:-tests tiny mx}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
has() { [[ " $STEPS " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
t() { local n=$1; shift; local s=$(date +%s%N); "$@" > $O/$n.out 2> $O/$n.err; local rc=$?; echo "== $n rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms"; grep -E "timeline|generate: |target forward|gemm tuning|kernel compile|cache read|weights hash|error|Error|diverged" $O/$n.err | tail -6; }
live_summary() {
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); ps=d if isinstance(d,list) else d.get('prompts',[]); print(' ', sys.argv[2], len(ps), 'prompts,', sum(1 for p in ps if p.get('lossless')), 'lossless, mean tau', round(sum(p.get('tau',0) for p in ps)/max(1,len(ps)),4))" $O/$1.out $1 2>&1 | cut -c1-300
}
if has tests; then
  for t in ${TESTS:-cuda-verify cuda-mxfp4 cuda-sinks-windows cuda-moe cuda-decode cuda-attention}; do
    s=$(date +%s)
    timeout 150 "$B/$t" --test-threads 1 --nocapture > $O/$t.txt 2>&1
    echo "== $t rc=$? $(( $(date +%s) - s )) s (total $(( $(date +%s) - T0 )) s)"
    grep -E "^test .*(FAILED|ok)$|test result|panicked|greedy equals|last hidden|oracle τ" $O/$t.txt | grep -v "^test .* ok$" | head -30
  done
fi
if has tiny; then
  python3 tools/bench/make_random_target.py --out /tmp/gt --arch gpt-oss-tiny --drafters 1 > $O/make-tiny.log 2>&1; tail -1 $O/make-tiny.log
  for be in cuda cpu; do
    DRAFTLENS_DATA=/tmp/gd-$be DRAFTLENS_CACHE=/tmp/gc-$be t tiny_run_$be timeout 120 $B/draftlens --json run --backend $be --target /tmp/gt --drafter /tmp/gt-drafters --prompts builtin:humaneval --limit 16 --max-new-tokens 64 --db /tmp/gt-$be.sqlite
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], json.dumps(d)[:400])" $O/tiny_run_$be.out $be 2>&1 | head -3
  done
  D=$(ls -d /tmp/gt-drafters/step-* | head -1)
  L="live --backend cuda --target /tmp/gt --drafter $D --prompts builtin:humaneval --limit 16 --max-new-tokens 64 --json"
  DRAFTLENS_DATA=/tmp/gd-cuda DRAFTLENS_CACHE=/tmp/gc-cuda t tiny_live_decode_steps timeout 90 $B/draftlens $L
  DRAFTLENS_VERIFY=causal DRAFTLENS_DATA=/tmp/gd-cuda DRAFTLENS_CACHE=/tmp/gc-cuda t tiny_live_causal timeout 90 $B/draftlens $L
  for n in tiny_live_decode_steps tiny_live_causal; do live_summary $n; done
fi
echo "== steps so far: $(( $(date +%s) - T0 )) s"
if has mem; then
  O=$OUTDIR/mem timeout $(left) bash tools/bench/moe_memory_device.sh 2>&1 | grep -v "^$"
fi
if has mx; then
  LIMIT=$(left) O=$OUTDIR/mx STEPS="make bench" bash tools/bench/mxfp4_packed_device.sh 2>&1 | grep -v "^$"
  rm -rf /tmp/g20mx
fi
if has e2e; then
  python3 tools/bench/make_random_target.py --out /tmp/g20 --arch gpt-oss-20b-8l --drafters 3 > $O/make.log 2>&1; tail -2 $O/make.log
  cat /tmp/g20/*.safetensors > /dev/null
  X="extract --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128 --timeline"
  DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cold timeout 150 $B/draftlens --json $X
  DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cached timeout 60 $B/draftlens --json $X
  DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_run3 timeout 150 $B/draftlens --json run --backend cuda --target /tmp/g20 --drafter /tmp/g20-drafters --prompts builtin:humaneval --limit 164 --max-new-tokens 128 --db /tmp/g20.sqlite
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:600])" $O/dl_run3.out 2>&1 | head -3
  DRAFTLENS_DATA=/tmp/d4 DRAFTLENS_CACHE=/tmp/c4 t gen_b1 timeout 60 $B/draftlens generate --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 8 --gen-batch 1 --max-new-tokens 128 --timeline
  D=$(ls -d /tmp/g20-drafters/step-* | head -1)
  L="live --backend cuda --target /tmp/g20 --drafter $D --prompts builtin:humaneval --limit 16 --max-new-tokens 128 --json"
  DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t live_decode_steps timeout 90 $B/draftlens $L
  DRAFTLENS_VERIFY=causal DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t live_causal timeout 90 $B/draftlens $L
  for n in live_decode_steps live_causal; do live_summary $n; done
fi
if has hf; then
  echo "== before hf: $(( $(date +%s) - T0 )) s"
  t hf_run3 timeout $(left) python3 tools/bench/hf_e2e.py --model /tmp/g20 --prompts crates/engine/builtin-prompts/humaneval.jsonl --limit 164 --layers 1,3,5,6 --max-new 128 --batch 32 --attn eager --out /tmp/hf_out --drafters /tmp/g20-drafters
  tail -2 $O/hf_run3.out; tail -3 $O/hf_run3.err
fi
cp /tmp/dk/gemm-choices-v1.json $OUTDIR/ 2>/dev/null
tar czf $OUTDIR/s25.tgz -C $O .
echo "== done $(( $(date +%s) - T0 )) s"
