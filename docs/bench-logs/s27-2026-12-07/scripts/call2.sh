#!/usr/bin/env bash
# Session 27, call 2 (issue 34's end-to-end goal; issue 38's decode step):
#   tests  cuda_ops' raw-upload tests (the GPU transpose of stored-transposed bf16 experts against
#          the host's, bit for bit), cuda_moe, cuda_gdn on the shipped images ($TESTS)
#   e2e    gpt-oss-20b shapes (8 of 24 layers, bf16 experts): extract cold and cached, run ×3
#          checkpoints cold and cached (164 HumanEval prompts, 128 new tokens), generate at batch 1
#          (8 prompts) and 64, the copy rate
#   trace  generate at batch 1 (2 prompts) under the CUPTI kernel trace (tools/bench/kernel_trace.sh):
#          where a decode step's 17 % of idle GPU time goes
#   hf     the transformers script on the same folder in the same call (eager attention: sinks)
#   B=target-carry/s27b STEPS="tests e2e trace hf" bash docs/bench-logs/s27-2026-12-07/scripts/call2.sh
set -u
B=${B:-target-carry/s27b}
T0=$(date +%s)
OUTDIR=$OUT
O=$OUTDIR/o
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUTDIR/gpu.txt
mkdir -p /work && for d in /work/main /work/relsrc; do [ -e $d ] || ln -sfn "$PWD" $d; done
LIMIT=${LIMIT:-560}
STEPS=${STEPS:-tests e2e trace hf}
export PYTHONUNBUFFERED=1
if has tests; then
  for t in ${TESTS:-cuda_ops:raw_upload cuda_moe cuda_gdn}; do
    bin=${t%%:*}; filter=${t#*:}; [ "$filter" = "$t" ] && filter=
    [ -e "$B/$bin" ] || continue
    s=$(date +%s)
    timeout ${TEST_LIMIT:-150} "$B/$bin" $filter --test-threads 1 --nocapture > $O/$bin.txt 2>&1
    echo "== $t rc=$? $(( $(date +%s) - s )) s (total $(( $(date +%s) - T0 )) s)"
    grep -E "^test .*(FAILED|ok)$|test result|panicked|differs" $O/$bin.txt | grep -v "^test .* ok$" | head -20
  done
fi
echo "== steps so far: $(( $(date +%s) - T0 )) s"
if has e2e; then
  python3 tools/bench/make_random_target.py --out /tmp/g20 --arch gpt-oss-20b-8l --drafters 3 > $O/make.log 2>&1; tail -2 $O/make.log
  cat /tmp/g20/*.safetensors > /dev/null
  X="extract --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128 --timeline"
  R="run --backend cuda --target /tmp/g20 --drafter /tmp/g20-drafters --prompts builtin:humaneval --limit 164 --max-new-tokens 128 --timeline"
  export DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1
  t dl_extract_cold timeout 150 $B/draftlens --json $X
  t dl_extract_cached timeout 60 $B/draftlens --json $X
  t dl_run3_cold timeout 150 $B/draftlens --json $R --db /tmp/g20.sqlite
  t dl_run3_cached timeout 60 $B/draftlens --json $R --db /tmp/g20b.sqlite
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print([(r['name'], r['metrics']['native']['tau_replayed_pooled']['value']) for r in d])" $O/dl_run3_cold.out 2>&1 | head -2
  for gb in 1 64; do
    n=$([ $gb = 1 ] && echo 8 || echo 164)
    DRAFTLENS_DATA=/tmp/d4 DRAFTLENS_CACHE=/tmp/c4 t gen_b$gb timeout 60 $B/draftlens generate --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit $n --gen-batch $gb --max-new-tokens 128 --timeline
  done
  python3 tools/bench/copy_rate.py | tee $O/copy_rate.txt
  unset DRAFTLENS_DATA DRAFTLENS_CACHE
fi
if has trace; then
  DRAFTLENS_DATA=/tmp/d5 DRAFTLENS_CACHE=/tmp/c5 timeout 120 bash tools/bench/kernel_trace.sh $O/trace_b1.txt $B/draftlens generate --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 2 --gen-batch 1 --max-new-tokens 128 --timeline
  python3 tools/bench/kernel_trace.py $O/trace_b1.txt gaps - --top 12 > $O/trace_gaps.txt 2>&1; head -40 $O/trace_gaps.txt
  python3 tools/bench/kernel_trace.py $O/trace_b1.txt kernels - --top 30 > $O/trace_kernels.txt 2>&1; head -35 $O/trace_kernels.txt
  xz -T0 -6 $O/trace_b1.txt
fi
if has hf; then
  echo "== before hf: $(( $(date +%s) - T0 )) s"
  t hf_run3 timeout $(left) /usr/bin/time -f "wall_s=%e" python3 tools/bench/hf_e2e.py --model /tmp/g20 --prompts crates/engine/builtin-prompts/humaneval.jsonl --limit 164 --layers 1,3,5,6 --max-new 128 --batch 32 --attn eager --out /tmp/hf_out --drafters /tmp/g20-drafters
  tail -2 $O/hf_run3.out; tail -3 $O/hf_run3.err
fi
cp /tmp/dk/gemm-choices-v1.json $OUTDIR/ 2>/dev/null
tar czf $OUTDIR/s27.tgz -C $O .
echo "== done $(( $(date +%s) - T0 )) s"
