#!/usr/bin/env bash
# Session 20, call 4: where the MoE path stands end to end (issue 34 item 5), before any grouped-GEMM
# work: draftlens against the transformers script a user would write (tools/bench/hf_e2e.py), same
# random Qwen3-30B-A3B-shaped target (8 of 48 layers), 164 HumanEval prompts, 128 new tokens, taps
# 1,3,5,6; `extract` cold and cached, `run` with 3 DFlash checkpoints; transformers generate + taps at
# batch 32, then with the 3 drafters.
#   B=target-carry/s20 bash docs/bench-logs/s20-2026-12-06/scripts/call4.sh
set -u
B=${B:-target-carry/s20}
source tools/bench/device_env.sh
export DRAFTLENS_DATA=/tmp/data DRAFTLENS_CACHE=/tmp/cache PYTHONUNBUFFERED=1
P=crates/engine/builtin-prompts/humaneval.jsonl
python3 tools/bench/make_random_target.py --out /tmp/moe --arch qwen3-30b-a3b-8l --drafters 3 --taps 1,3,5,6 > $O/make.log 2>&1; tail -1 $O/make.log
cat /tmp/moe/*.safetensors > /dev/null
t() { local n=$1; shift; local s=$(date +%s%N); "$@" > $O/$n.out 2> $O/$n.err; local rc=$?; echo "== $n rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms"; }
t hf_extract timeout 200 python3 tools/bench/hf_e2e.py --model /tmp/moe --prompts $P --limit 164 --layers 1,3,5,6 --max-new 128 --batch 32 --out /tmp/hf_out
tail -1 $O/hf_extract.out
t dl_extract_cold timeout 240 $B/draftlens --json extract --backend cuda --target /tmp/moe --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128 --timeline
grep -E "timeline" $O/dl_extract_cold.err | tail -3
t dl_extract_cached timeout 120 $B/draftlens --json extract --backend cuda --target /tmp/moe --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128
t dl_run3 timeout 240 $B/draftlens --json run --backend cuda --target /tmp/moe --drafter /tmp/moe-drafters --prompts builtin:humaneval --limit 164 --max-new-tokens 128 --db /tmp/moe.sqlite
t hf_run3 timeout 240 python3 tools/bench/hf_e2e.py --model /tmp/moe --prompts $P --limit 164 --layers 1,3,5,6 --max-new 128 --batch 32 --out /tmp/hf_out2 --drafters /tmp/moe-drafters
tail -1 $O/hf_run3.out
tar czf $OUT/s20-call4.tgz -C $O .
