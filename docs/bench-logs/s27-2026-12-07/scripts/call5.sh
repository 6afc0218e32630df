#!/usr/bin/env bash
# Session 27, call 5 (issue 34's decode step at batch 1): the gpt-oss-20b-shaped target's decode
# step with the identity already remembered (no hash running beside it), at batch 1 ($B1_PROMPTS
# prompts, 8) and 64 (164 prompts), each after a warm-up run that hashes the weights and tunes the
# GEMMs; the copy rate; then the test binaries of $TESTS (NAME or NAME:FILTER; cuda_gdn on the
# shipped gdn image) that were carried.
#   B=target-carry/s27e bash docs/bench-logs/s27-2026-12-07/scripts/call5.sh      # what ran
# The next measurement (32 prompts at batch 1 amortise the first prompt's one-time work; the
# raw-upload GPU tests after the matrix_from_chunks refactor), not run in session 27:
#   B=target-carry/s27g B1_PROMPTS=32 TESTS=cuda_ops:raw_upload bash docs/bench-logs/s27-2026-12-07/scripts/call5.sh
set -u
B=${B:-target-carry/s27e}
T0=$(date +%s)
OUTDIR=$OUT
O=$OUTDIR/o
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUTDIR/gpu.txt
python3 tools/bench/make_random_target.py --out /tmp/g20 --arch gpt-oss-20b-8l --drafters 0 > $O/make.log 2>&1; tail -1 $O/make.log
cat /tmp/g20/*.safetensors > /dev/null
export DRAFTLENS_CACHE=/tmp/c6
G="generate --backend cuda --target /tmp/g20 --prompts builtin:humaneval --timeline"
# Continuations are cached by prompt and length: each run below asks for a length no earlier run
# decoded, so every step is decoded (the warm-up only hashes the weights and tunes the GEMMs).
t gen_warm timeout 60 $B/draftlens $G --limit 8 --gen-batch 1 --max-new-tokens 125
t gen_b1 timeout 90 $B/draftlens $G --limit ${B1_PROMPTS:-8} --gen-batch 1 --max-new-tokens 128
t gen_b64 timeout 60 $B/draftlens $G --limit 164 --gen-batch 64 --max-new-tokens 127
python3 tools/bench/copy_rate.py | tee $O/copy_rate.txt
mkdir -p /work && for d in /work/main /work/relsrc; do [ -e $d ] || ln -sfn "$PWD" $d; done
for t in ${TESTS:-cuda_gdn}; do
  bin=${t%%:*}; filter=${t#*:}; [ "$filter" = "$t" ] && filter=
  [ -e $B/$bin ] || continue
  s=$(date +%s); timeout 120 $B/$bin $filter --test-threads 1 > $O/$bin.txt 2>&1
  echo "== $t rc=$? $(( $(date +%s) - s )) s"; grep -E "test result|FAILED|panicked" $O/$bin.txt | head -8
done
tar czf $OUTDIR/s27e.tgz -C $O .
echo "== done $(( $(date +%s) - T0 )) s"
