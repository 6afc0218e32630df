#!/usr/bin/env bash
# Session 25, call 3 (the same warm H100 after call.sh): live decoding on a gpt-oss-20b-shaped
# target (8 of 24 layers, bf16 experts, one random DFlash drafter of B = 16), 16 HumanEval prompts
# of 128 tokens with --baseline, the verify pass as decode steps (default) and then
# DRAFTLENS_VERIFY=causal. Each run was cut by its 80 s timeout after all 16 prompts and the
# baseline had been measured (the JSON was written; the run was marked failed in its database).
set -u; B=target-carry/s25c; O=$OUT/o; source tools/bench/device_env.sh >/dev/null 2>&1
mkdir -p /work && ln -sfn "$PWD" /work/main; T0=$(date +%s)
python3 tools/bench/make_random_target.py --out /tmp/g20 --arch gpt-oss-20b-8l --drafters 1 > $O/make.log 2>&1
D=$(ls -d /tmp/g20-drafters/step-* | head -1)
for mode in decode causal; do
  if [ $mode = causal ]; then export DRAFTLENS_VERIFY=causal; fi
  DRAFTLENS_CACHE=/tmp/c1 timeout 80 $B/draftlens live --backend cuda --target /tmp/g20 --drafter $D \
    --prompts builtin:humaneval --limit 16 --max-new-tokens 128 --json --baseline > $O/live_$mode.out 2> $O/live_$mode.err
done
