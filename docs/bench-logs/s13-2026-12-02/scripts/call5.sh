#!/usr/bin/env bash
# Session 13, call 5: lookups wait only for their own queued keys (CacheWriter::wait_for);
# Qwen3-8B `run` of 3 checkpoints from nothing on a fresh machine, again with only the hidden-state
# and record caches emptied, then cached.
# 164 HumanEval prompts, 128 new tokens.
set -u
B=target-carry/s13
O=/tmp/o; rm -rf $O; mkdir -p $O
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DRAFTLENS_KERNEL_CACHE=/tmp/dk
for f in $B/*.xz; do [ -e "${f%.xz}" ] || xz -dk "$f"; done
chmod +x $B/* 2>/dev/null
tar -xJf $B/tok.tar.xz -C /tmp && mkdir -p data/tokenizer && rm -rf data/tokenizer/qwen3-hf && mv /tmp/tokmin data/tokenizer/qwen3-hf
run() {  # name target drafters
  /usr/bin/time -v timeout 300 $B/draftlens run --backend cuda --target $2 --drafter $3 \
    --prompts builtin:humaneval --limit 164 --json --timeline > $O/$1.json 2> $O/$1.err
  echo "$1 rc=$?"; grep -E "timeline:|Maximum resident" $O/$1.err
}
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
run q8b_cold /tmp/q8b /tmp/q8b-drafters
grep -E "identity|kernel compile|gemm tuning" $O/q8b_cold.err
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_CACHE=/tmp/dlc8b run q8b_warm /tmp/q8b /tmp/q8b-drafters
sed -n '/timeline:/,/Command being/p' $O/q8b_warm.err | sed -n '2,40p'
sync; sleep 2
DRAFTLENS_CACHE=/tmp/dlc8b run q8b_cached /tmp/q8b /tmp/q8b-drafters
rm -rf /tmp/q8b /tmp/q8b-drafters /tmp/dlc8 /tmp/dlc8b
rm -f $O/*.json; find $O -size +3M -delete
tar czf $OUT/all.tgz -C $O .
