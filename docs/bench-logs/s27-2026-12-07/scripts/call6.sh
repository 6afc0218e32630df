#!/usr/bin/env bash
# Session 27, call 6 (issue 38 item 6): the GEMM choices of the random Qwen3-8B folder's shapes on
# this GPU (call 3's fresh-machine extract still tuned 17 shapes for 1.45 s: not shipped for the
# H100), to ship with the binary (tools/bench/ship_gemm_choices.py); a second extract with the
# choices persisted shows what tuning leaves.
#   B=target-carry/s27e bash docs/bench-logs/s27-2026-12-07/scripts/call6.sh
set -u
B=${B:-target-carry/s27e}
source tools/bench/device_env.sh
python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make.log 2>&1; tail -1 $O/make.log
cat /tmp/q8b/*.safetensors > /dev/null
X="extract --backend cuda --target /tmp/q8b --prompts builtin:humaneval --limit 164 --layers 1,9,17,25,33 --timeline"
rm -rf /tmp/dk
DRAFTLENS_CACHE=/tmp/c7a t q8b_tune timeout 90 $B/draftlens $X
DRAFTLENS_CACHE=/tmp/c7b t q8b_tuned timeout 90 $B/draftlens $X
cp /tmp/dk/gemm-choices-v1.json $OUT/
tar czf $OUT/s27f.tgz -C $O .
