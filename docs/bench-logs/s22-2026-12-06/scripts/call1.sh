#!/usr/bin/env bash
# Session 22, device call 1 (issue 35): every drafter family's known answers on CUDA
# (tools/bench/families_known_answer_device.sh), then EAGLE-3's dynamic tree on CUDA (the engine's
# eagle3 test binary, test cuda_trees: TOPK 1 trees = the chains, the successor drafter's trees,
# the golden trees in bf16), then the independent cost benchmark if its script is there.
#   B=target-carry/s22 bash docs/bench-logs/s22-2026-12-06/scripts/call1.sh
set -u
B=${B:-target-carry/s22}
T0=$(date +%s)
B=$B bash tools/bench/families_known_answer_device.sh
echo "== families: $(( $(date +%s) - T0 )) s"
if [ -e "$B/eagle3-test.xz" ]; then
  xz -dk "$B/eagle3-test.xz" 2>/dev/null; chmod +x "$B/eagle3-test"
  # the test binary finds its fixtures under the path it was built in
  mkdir -p /work && ln -sfn "$PWD" /work/main
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 DRAFTLENS_KERNEL_CACHE=/tmp/dk timeout 240 "$B/eagle3-test" cuda_trees --nocapture 2>&1 | tail -40 | tee $OUT/eagle3-cuda-trees.txt
  echo "== eagle3 cuda_trees rc=${PIPESTATUS[0]}: $(( $(date +%s) - T0 )) s"
fi
if [ -e tools/bench/verdict_costs_device.sh ] && [ -n "${COSTS:-}" ]; then
  B=$B timeout 200 bash tools/bench/verdict_costs_device.sh 2>&1 | tail -40 | tee $OUT/verdict-costs.txt
  echo "== costs: $(( $(date +%s) - T0 )) s"
fi
