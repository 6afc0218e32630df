#!/usr/bin/env bash
# Session 27, call 1 (issues 34 and 38):
#   tests  cuda_lm_head (the fused LM head + top-K's first GPU run), cuda_attention (the hd256
#          stack-frame fix), cuda_gdn and cuda_kernel_images on the shipped images ($TESTS)
#   e2e    gpt-oss-20b shapes (8 of 24 layers, bf16 experts): extract cold with --timeline, then
#          `run` (3 checkpoints, 164 HumanEval prompts) cold — no records cached — with the LM head
#          unfused and fused (DRAFTLENS_LM_HEAD), each on its own copy of the extracted cache
#   B=target-carry/s27 STEPS="tests e2e" bash docs/bench-logs/s27-2026-12-07/scripts/call1.sh
set -u
B=${B:-target-carry/s27}
T0=$(date +%s)
OUTDIR=$OUT
O=$OUTDIR/o
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUTDIR/gpu.txt
# The tests find their fixtures through the path they were built in (/work/main or /work/relsrc).
mkdir -p /work && for d in /work/main /work/relsrc; do [ -e $d ] || ln -sfn "$PWD" $d; done
LIMIT=${LIMIT:-560}
STEPS=${STEPS:-tests e2e}
export PYTHONUNBUFFERED=1
if has tests; then
  for t in ${TESTS:-cuda_lm_head cuda_attention cuda_gdn cuda_kernel_images}; do
    [ -e "$B/$t" ] || continue
    s=$(date +%s)
    timeout ${TEST_LIMIT:-150} "$B/$t" --test-threads 1 --nocapture > $O/$t.txt 2>&1
    echo "== $t rc=$? $(( $(date +%s) - s )) s (total $(( $(date +%s) - T0 )) s)"
    grep -E "^test .*(FAILED|ok)$|test result|panicked|within|CUBIN|modules loaded|unlike" $O/$t.txt | grep -v "^test .* ok$" | head -30
  done
fi
echo "== steps so far: $(( $(date +%s) - T0 )) s"
if has e2e; then
  python3 tools/bench/make_random_target.py --out /tmp/g20 --arch gpt-oss-20b-8l --drafters 3 > $O/make.log 2>&1; tail -2 $O/make.log
  cat /tmp/g20/*.safetensors > /dev/null
  X="extract --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128 --timeline"
  DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cold timeout 150 $B/draftlens --json $X
  cp -r /tmp/c1 /tmp/c2
  for lmh in unfused fused; do
    c=$([ $lmh = unfused ] && echo /tmp/c1 || echo /tmp/c2)
    DRAFTLENS_LM_HEAD=$lmh DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=$c t dl_run3_$lmh timeout 150 $B/draftlens --json run --backend cuda --target /tmp/g20 --drafter /tmp/g20-drafters --prompts builtin:humaneval --limit 164 --max-new-tokens 128 --db /tmp/g20-$lmh.sqlite --timeline
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:400])" $O/dl_run3_$lmh.out 2>&1 | head -2
  done
fi
cp /tmp/dk/gemm-choices-v1.json $OUTDIR/ 2>/dev/null
tar czf $OUTDIR/s27.tgz -C $O .
echo "== done $(( $(date +%s) - T0 )) s"
