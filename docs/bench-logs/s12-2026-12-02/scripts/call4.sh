#!/usr/bin/env bash
# Session 12, call 4: the end-to-end runs with this session's binaries: Qwen3-8B (3 checkpoints)
# cold and cached, then the whole Qwen3.6-27B (one checkpoint) cold, 164 HumanEval prompts.
set -u
B=target-carry/s12
O=/tmp/o; rm -rf $O; mkdir -p $O
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DRAFTLENS_KERNEL_CACHE=/tmp/dk
for f in $B/*.xz; do [ -e "${f%.xz}" ] || xz -dk "$f"; done
chmod +x $B/* 2>/dev/null
rm -rf /tmp/q27 /tmp/q27-drafters /tmp/dlc /tmp/q8b /tmp/q8b-drafters
tar -xJf $B/tok.tar.xz -C /tmp && mkdir -p data/tokenizer && rm -rf data/tokenizer/qwen3-hf && mv /tmp/tokmin data/tokenizer/qwen3-hf
run() {  # name target drafters
  /usr/bin/time -v timeout 300 $B/draftlens run --backend cuda --target $2 --drafter $3 \
    --prompts builtin:humaneval --limit 164 --json --timeline > $O/$1.json 2> $O/$1.err
  echo "$1 rc=$?"; grep -E "timeline:|generate: decode|generate: prefill|drafter LM|identity|Maximum resident" $O/$1.err
}
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
run q8b_cold /tmp/q8b /tmp/q8b-drafters
sync; sleep 2
run q8b_cached /tmp/q8b /tmp/q8b-drafters
rm -rf /tmp/q8b /tmp/q8b-drafters /tmp/dlc8
tar czf $OUT/all8.tgz -C $O .
M=/tmp/q27full; [ "$(df --output=avail -B1G /dev/shm | tail -n 1)" -ge 60 ] && M=/dev/shm/q27full
export DRAFTLENS_CACHE=/tmp/dlc27
timeout 240 python3 tools/bench/make_random_target.py --arch qwen3.6-27b --out $M --taps 1,31,61 --drafters 1 > $O/make27.log 2>&1; echo "make27 rc=$?"
run q27_cold $M $M-drafters
tar czf $OUT/all.tgz -C $O .
