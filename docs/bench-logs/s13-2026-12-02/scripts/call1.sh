#!/usr/bin/env bash
# Session 13, call 1 (a fresh machine, binaries from HEAD): (1) the cold 8B `run` on an empty
# NVRTC cache (does session 12's compile-time fix hold: `kernel compile (wait)`?), with the host
# RSS per phase; (2) the same job again with only the hidden-state cache emptied, under the kernel
# trace, to find where the GPU idles between phases (kernel_trace.py gaps); (3) the cached rerun;
# (4) the 16-layer Qwen3.6-27B `run` under the kernel trace (why its target forward is ~63 % busy).
set -u
B=target-carry/s13 DL_SHOW="timeline:|generate: decode|generate: prefill|target forward|drafter|kernel compile|identity|host RSS|Maximum resident|Elapsed"
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm --format=csv,noheader
export DRAFTLENS_CACHE=/tmp/dlc8
timeout 150 python3 tools/bench/make_random_target.py --out /tmp/q8b > $O/make8.log 2>&1; echo "make8 rc=$?"
dl_run q8b_cold /tmp/q8b /tmp/q8b-drafters
mkdir -p /tmp/dlc8b && cp -r /tmp/dlc8/identity /tmp/dlc8b/
DRAFTLENS_CACHE=/tmp/dlc8b dl_run q8b_traced /tmp/q8b /tmp/q8b-drafters bash tools/bench/kernel_trace.sh $O/q8b_trace.txt
grep -E "generate: decode|generate: prefill|target forward|drafter|tap download|store records" $O/q8b_trace.txt.stderr
python3 tools/bench/kernel_trace.py $O/q8b_trace.txt gaps - --top 40 > $O/q8b_gaps.txt; head -50 $O/q8b_gaps.txt
sync; sleep 2
dl_run q8b_cached /tmp/q8b /tmp/q8b-drafters
rm -rf /tmp/q8b /tmp/q8b-drafters /tmp/dlc8 /tmp/dlc8b
xz -T8 $O/q8b_trace.txt
tar czf $OUT/all8.tgz -C $O .
export DRAFTLENS_CACHE=/tmp/dlc27
timeout 200 python3 tools/bench/make_random_target.py --arch qwen3.6-27b-16l --out /tmp/q27 --taps 1,7,14 > $O/make27.log 2>&1; echo "make27 rc=$?"
dl_run q27_cold /tmp/q27 /tmp/q27-drafters
rm -rf /tmp/dlc27/hidden* ; mkdir -p /tmp/dlc27b && cp -r /tmp/dlc27/identity /tmp/dlc27b/
DRAFTLENS_CACHE=/tmp/dlc27b dl_run q27_traced /tmp/q27 /tmp/q27-drafters bash tools/bench/kernel_trace.sh $O/q27_trace.txt
grep -E "generate: decode|generate: prefill|target forward|drafter|tap download|store records" $O/q27_trace.txt.stderr
python3 tools/bench/kernel_trace.py $O/q27_trace.txt gaps - --top 40 > $O/q27_gaps.txt; head -50 $O/q27_gaps.txt
xz -T8 $O/q27_trace.txt
tar czf $OUT/all.tgz -C $O .
