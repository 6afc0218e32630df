#!/usr/bin/env bash
# Known answers of every drafter family on CUDA, in one device call (docs/live.md §4, "On the
# GPU"): the acceptance-bearing rounds (accepted drafts, the bonus, the drafters' state after
# accepted and partly accepted rounds, the DFlash2 selector's path, EAGLE-3 / MTP chains after
# accepted steps) that random drafters never reach.
#   1. tools/golden/make_successor_fixtures.py writes the successor targets (Qwen3, Qwen3.5 with
#      its MTP head) and per family an exact and a defect drafter into $O/fixtures; where torch
#      and transformers are installed it also checks both targets with transformers (bf16 on
#      the GPU): every greedy next token the successor, with its margin;
#   2. tools/bench/families_known_answer.py runs each case through the release binary with
#      --backend $DEV: run, run --temperature 1 (not DFlash2), live at T = 0, T = 1 and
#      T = 0.7 / top-k 8 / top-p 0.9, and prints PASS / FAIL per case with τ and rounds
#      (exact drafters: τ = B exactly; defect drafters: the generator's rounds per prompt;
#      every output the successor words, lossless at T = 0).
# Logs (gpu.txt, fixtures.log, check-hf.log, summary.txt, logs/<case>.<step>.json|.err) are
# tarred into $OUT/families-known-answer.tgz. From the repository root, with the release binary
# (draftlens or draftlens.xz) carried in B:
#   B=target-carry/ka bash tools/bench/families_known_answer_device.sh
# A CPU dry run of the same logic (no GPU): DEV=cpu B=target/release O=/tmp/o OUT=/tmp/out \
#   bash tools/bench/families_known_answer_device.sh
set -u
B=${B:-target-carry/ka}
DEV=${DEV:-cuda}   # the backend under test (cpu for a dry run)
PY=${PY:-python3}
source tools/bench/device_env.sh
export DRAFTLENS_DATA=/tmp/data
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no GPU"; } 2>&1 | tee $O/gpu.txt
F=$O/fixtures
HF=cpu; [ "$DEV" = cuda ] && HF=cuda
if $PY -c "import torch, transformers" 2>/dev/null; then
  $PY tools/golden/make_successor_fixtures.py --out $F --check-hf $HF > $O/fixtures.log 2>&1 || echo "FAIL check-hf ($HF): see fixtures.log"
  grep -E "^check-hf|Error" $O/fixtures.log | tee $O/check-hf.log
else
  $PY tools/golden/make_successor_fixtures.py --out $F > $O/fixtures.log 2>&1 || echo "FAIL: the generator failed, see fixtures.log"
  echo "check-hf skipped: $PY has no torch + transformers" | tee $O/check-hf.log
fi
grep -E "^fixtures|^  " $O/fixtures.log
$PY tools/bench/families_known_answer.py --draftlens "$B/draftlens" --backend $DEV --fixtures $F --logs $O/logs 2>&1 | tee $O/summary.txt
rc=${PIPESTATUS[0]}
echo "== done in $(( $(date +%s) - T0 )) s, checker exit $rc"
rm -rf $O/logs/cache
tar czf $OUT/families-known-answer.tgz -C $O --exclude=./fixtures .
