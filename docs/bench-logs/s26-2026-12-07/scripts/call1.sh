#!/usr/bin/env bash
# Session 26, call 1 (issue 34's last item; reruns of session 25's two GPU fixes):
#   tests  cuda_kernel_images (the shipped CUBINs load, and equal this machine's NVRTC?), cuda_moe
#          (golden bound from transformers' own bf16 error), cuda_attention (compile-time sinks instance), cuda_mxfp4 and cuda_mxfp4_gguf (one grouped-GEMM launcher for bf16 and
#          packed experts; GGUF experts repacked), cuda_sinks_windows ($TESTS)
#   e2e    gpt-oss-20b shapes (8 of 24 layers, 32 experts top-4, bf16 experts as save_pretrained writes them):
#          extract cold/cached (and cold with DRAFTLENS_KERNEL_IMAGES=nvrtc), run (3 checkpoints) on
#          164 HumanEval prompts, generate at batch 1
#          and 64 (the decode step against the bytes it reads), the copy rate (torch copy_)
#   hf     the transformers script on the same folder (eager attention: gpt-oss's sinks)
#   B=target-carry/s26 STEPS="tests e2e hf" bash docs/bench-logs/s26-2026-12-07/scripts/call1.sh
set -u
B=${B:-target-carry/s26}
T0=$(date +%s)
OUTDIR=$OUT
O=$OUTDIR/o
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUTDIR/gpu.txt
# The tests find their fixtures through the path they were built in (/work/main or /work/relsrc).
mkdir -p /work && for d in /work/main /work/relsrc; do [ -e $d ] || ln -sfn "$PWD" $d; done
LIMIT=${LIMIT:-560}
STEPS=${STEPS:-tests e2e hf}
export PYTHONUNBUFFERED=1
if has tests; then
  for t in ${TESTS:-cuda_kernel_images cuda_moe cuda_attention cuda_mxfp4 cuda_mxfp4_gguf cuda_sinks_windows}; do
    s=$(date +%s)
    timeout 150 "$B/$t" --test-threads 1 --nocapture > $O/$t.txt 2>&1
    echo "== $t rc=$? $(( $(date +%s) - s )) s (total $(( $(date +%s) - T0 )) s)"
    grep -E "^test .*(FAILED|ok)$|test result|panicked|greedy equals|last hidden|oracle τ|CUBIN|modules loaded|unlike" $O/$t.txt | grep -v "^test .* ok$" | head -30
  done
fi
echo "== steps so far: $(( $(date +%s) - T0 )) s"
if has e2e; then
  python3 tools/bench/make_random_target.py --out /tmp/g20 --arch gpt-oss-20b-8l --drafters 3 > $O/make.log 2>&1; tail -2 $O/make.log
  cat /tmp/g20/*.safetensors > /dev/null
  X="extract --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128 --timeline"
  DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cold timeout 150 $B/draftlens --json $X
  DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cached timeout 60 $B/draftlens --json $X
  # The same cold extract compiling every kernel with NVRTC (an empty kernel cache but this
  # machine's GEMM choices): what the shipped kernel images save a fresh machine.
  mkdir -p /tmp/dk-nvrtc && cp /tmp/dk/gemm-choices-v1.json /tmp/dk-nvrtc/ 2>/dev/null
  DRAFTLENS_KERNEL_IMAGES=nvrtc DRAFTLENS_KERNEL_CACHE=/tmp/dk-nvrtc DRAFTLENS_DATA=/tmp/d2 DRAFTLENS_CACHE=/tmp/c2 t dl_extract_cold_nvrtc timeout 150 $B/draftlens --json $X
  DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_run3 timeout 150 $B/draftlens --json run --backend cuda --target /tmp/g20 --drafter /tmp/g20-drafters --prompts builtin:humaneval --limit 164 --max-new-tokens 128 --db /tmp/g20.sqlite
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:600])" $O/dl_run3.out 2>&1 | head -3
  for gb in ${GEN_BATCHES:-1 64}; do
    n=$([ $gb = 1 ] && echo 8 || echo 164)
    DRAFTLENS_DATA=/tmp/d4 DRAFTLENS_CACHE=/tmp/c4 t gen_b$gb timeout 60 $B/draftlens generate --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit $n --gen-batch $gb --max-new-tokens 128 --timeline
  done
  $B/draftlens inspect /tmp/g20 --json > $O/inspect.json 2>&1
  python3 tools/bench/copy_rate.py | tee $O/copy_rate.txt
fi
if has hf; then
  echo "== before hf: $(( $(date +%s) - T0 )) s"
  t hf_run3 timeout $(left) python3 tools/bench/hf_e2e.py --model /tmp/g20 --prompts crates/engine/builtin-prompts/humaneval.jsonl --limit 164 --layers 1,3,5,6 --max-new 128 --batch 32 --attn eager --out /tmp/hf_out --drafters /tmp/g20-drafters
  tail -2 $O/hf_run3.out; tail -3 $O/hf_run3.err
fi
cp /tmp/dk/gemm-choices-v1.json $OUTDIR/ 2>/dev/null
tar czf $OUTDIR/s26.tgz -C $O .
echo "== done $(( $(date +%s) - T0 )) s"
