#!/usr/bin/env bash
# Session 27, call 7 (issue 34's decode step at batch 1, more steps): the gpt-oss-20b-shaped target's decode
# step with the identity already remembered (no hash running beside it), at batch 1 (32 prompts)
# and 64 (164 prompts), each after a warm-up run that hashes the weights and tunes the GEMMs;
# the copy rate; then cuda_ops' raw-upload tests (the staging code the stacked and transposed
# uploads share).
#   B=target-carry/s27g bash docs/bench-logs/s27-2026-12-07/scripts/call7.sh
# Not run in session 27 (no device time left to start a machine): the next session's first call.
set -u
B=${B:-target-carry/s27g}
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
t gen_b1 timeout 90 $B/draftlens $G --limit 32 --gen-batch 1 --max-new-tokens 128
t gen_b64 timeout 60 $B/draftlens $G --limit 164 --gen-batch 64 --max-new-tokens 127
python3 tools/bench/copy_rate.py | tee $O/copy_rate.txt
mkdir -p /work && for d in /work/main /work/relsrc; do [ -e $d ] || ln -sfn "$PWD" $d; done
if [ -e $B/cuda_ops ]; then
  s=$(date +%s); timeout 60 $B/cuda_ops raw_upload --test-threads 1 > $O/cuda_ops.txt 2>&1
  echo "== cuda_ops raw_upload rc=$? $(( $(date +%s) - s )) s"; grep -E "test result|FAILED|panicked" $O/cuda_ops.txt | head -8
fi
tar czf $OUTDIR/s27g.tgz -C $O .
echo "== done $(( $(date +%s) - T0 )) s"
