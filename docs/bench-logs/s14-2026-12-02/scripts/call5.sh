#!/usr/bin/env bash
# Session 14, call 5 (target-carry/s14c, as call 4): nothing run before on the machine, so the 8B
# `run` of 3 checkpoints compiles its kernels itself (NVRTC cache empty, GEMM choices cold: the
# fresh-machine case, with malloc_trim after each compile); then again with kernels warm; then the
# whole Qwen3.6-27B (one checkpoint) from nothing. 164 HumanEval prompts, 128 new tokens.
set -u
B=target-carry/s14c DL_SHOW="timeline:|Maximum resident"
source tools/bench/device_env.sh
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
dl_run q8b_cold /tmp/q8b /tmp/q8b-drafters
sed -n '/timeline:/,/Command being/p' $O/q8b_cold.err | sed -n '2,36p'
sync; sleep 3
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_warm /tmp/q8b /tmp/q8b-drafters
rm -rf /tmp/q8b /tmp/q8b-drafters /tmp/dlc8 /tmp/dlc8b
M=/tmp/q27full; [ "$(df --output=avail -B1G /dev/shm | tail -n 1)" -ge 60 ] && M=/dev/shm/q27full
export DRAFTLENS_CACHE=/tmp/dlc27
timeout 240 python3 tools/bench/make_random_target.py --arch qwen3.6-27b --out $M --taps 1,31,61 --drafters 1 > $O/make27.log 2>&1; echo "make27 rc=$?"
dl_run q27_cold $M $M-drafters
sed -n '/timeline:/,/Command being/p' $O/q27_cold.err | sed -n '2,36p'
rm -f $O/*.json; find $O -size +3M -delete
tar czf $OUT/all.tgz -C $O .
