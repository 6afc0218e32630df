#!/usr/bin/env bash
# Session 20, call 2: is the MoE CUDA-vs-CPU gap of call 1 (rel_l2 2.4e-2 at layer 1, over the 1.5e-2
# tolerance; greedy agreement 474/491, every position where the CPU's top-1 leads by > 0.1 nats
# agreeing) the routing of near-tied random router logits, reordered by bf16 rounding? The same
# Qwen3-30B-A3B-shaped target with its routers' weights scaled up (separated logits), side by side
# with scale 1, both through `parity --backends cpu,cuda`.
#   B=target-carry/s20 bash docs/bench-logs/s20-2026-12-06/scripts/call2.sh
set -u
B=${B:-target-carry/s20}
source tools/bench/device_env.sh
export DRAFTLENS_DATA=/tmp/data DRAFTLENS_CACHE=/tmp/cache
for scale in 1 30; do
  python3 tools/bench/make_random_target.py --out /tmp/moe$scale --arch qwen3-30b-a3b-8l --drafters 0 \
    --router-scale $scale > $O/make-$scale.log 2>&1 || echo "make $scale failed"
  timeout 200 $B/draftlens parity --target /tmp/moe$scale --backends cpu,cuda --limit 4 --max-new-tokens 32 \
    > $O/parity-moe-router$scale.out 2> $O/parity-moe-router$scale.err
  echo "== router scale $scale: parity rc=$?"; cat $O/parity-moe-router$scale.out
  rm -rf /tmp/moe$scale
done
$B/draftlens inspect /tmp/q8b > /dev/null 2>&1 || true
python3 tools/bench/make_random_target.py --out /tmp/moe1 --arch qwen3-30b-a3b-8l --drafters 0 > /dev/null 2>&1
$B/draftlens inspect /tmp/moe1 > $O/inspect-moe.out 2>&1; echo "== inspect rc=$?"; cat $O/inspect-moe.out
tar czf $OUT/s20-call2.tgz -C $O .
