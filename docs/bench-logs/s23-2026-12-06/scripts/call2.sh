#!/usr/bin/env bash
# Session 23, device call 2 (after call 1 found moe_plan's launch failing: the dynamic
# shared-memory opt-in was lowered by a smaller launch; the plan is now three launches without
# dynamic shared memory, and every row count routes on the device).
#  1. tests/cuda_moe.rs (row invariance 1..200, device vs host routing, batched greedy, goldens).
#  2. Issue 35: every family's known answers on CUDA, now with EAGLE-3's tree steps.
#  3. Issue 34 item 5: the end-to-end comparison, clean A/B of device and host routing (each with
#     its own data and cache folders, kernels compiled once before), cold first; decode steps at
#     batch 1 (8 prompts) and the copy rate, for the decode-step bandwidth.
#  4. Issue 34 item 4: tools/bench/memory_device.sh on the same target.
#   B=target-carry/s23 bash docs/bench-logs/s23-2026-12-06/scripts/call2.sh
set -u
B=${B:-target-carry/s23}
T0=$(date +%s)
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /work && ln -sfn "$PWD" /work/main
timeout 120 "$B/cuda-moe" --test-threads 1 --nocapture > $OUT/cuda-moe.txt 2>&1
echo "== cuda-moe rc=$? $(( $(date +%s) - T0 )) s"; grep -E "^test |test result|panicked|Err|rel |bit-identical|greedy equals" $OUT/cuda-moe.txt | head -70
# 2. families (writes $OUT/families-known-answer.tgz)
B=$B O=/tmp/o35 timeout 150 bash tools/bench/families_known_answer_device.sh > $OUT/families.txt 2>&1
echo "== families rc=$? $(( $(date +%s) - T0 )) s"; grep -E "PASS|FAIL|passed|     " $OUT/families.txt | head -30
# 3. MoE end to end
source tools/bench/device_env.sh   # O emptied again
export PYTHONUNBUFFERED=1
P=crates/engine/builtin-prompts/humaneval.jsonl
python3 tools/bench/make_random_target.py --out /tmp/moe --arch qwen3-30b-a3b-8l --drafters 3 --taps 1,3,5,6 > $O/make.log 2>&1; tail -1 $O/make.log
cat /tmp/moe/*.safetensors > /dev/null
t() { local n=$1; shift; local s=$(date +%s%N); "$@" > $O/$n.out 2> $O/$n.err; local rc=$?; echo "== $n rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms"; grep -E "timeline|generate: |target forward|gemm tuning|kernel compile|cache read|error" $O/$n.err | tail -8; }
X="extract --backend cuda --target /tmp/moe --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128 --timeline"
rm -rf /tmp/dk
DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cold timeout 150 $B/draftlens --json $X
DRAFTLENS_DATA=/tmp/d2 DRAFTLENS_CACHE=/tmp/c2 DRAFTLENS_MOE_ROUTING=host t dl_extract_host timeout 150 $B/draftlens --json $X
DRAFTLENS_DATA=/tmp/d3 DRAFTLENS_CACHE=/tmp/c3 t dl_extract_device timeout 150 $B/draftlens --json $X
DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cached timeout 60 $B/draftlens --json $X
DRAFTLENS_DATA=/tmp/d1 DRAFTLENS_CACHE=/tmp/c1 t dl_run3 timeout 120 $B/draftlens --json run --backend cuda --target /tmp/moe --drafter /tmp/moe-drafters --prompts builtin:humaneval --limit 164 --max-new-tokens 128 --db /tmp/moe.sqlite
G="generate --backend cuda --target /tmp/moe --prompts builtin:humaneval --limit 8 --gen-batch 1 --max-new-tokens 128 --timeline"
DRAFTLENS_DATA=/tmp/d4 DRAFTLENS_CACHE=/tmp/c4 t gen_b1_device timeout 60 $B/draftlens $G
DRAFTLENS_DATA=/tmp/d5 DRAFTLENS_CACHE=/tmp/c5 DRAFTLENS_MOE_ROUTING=host t gen_b1_host timeout 60 $B/draftlens $G
$B/draftlens inspect /tmp/moe --json > $O/inspect.json 2>&1
python3 - <<'PY' | tee $O/copy_rate.txt
import torch, time
x = torch.empty(2**31, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20): y.copy_(x)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 20
print(f"copy rate: {2 * x.numel() / dt / 1e9:.0f} GB/s (read + write of 2 GiB, torch copy_)")
PY
echo "== before hf: $(( $(date +%s) - T0 )) s"
t hf_run3 timeout 120 python3 tools/bench/hf_e2e.py --model /tmp/moe --prompts $P --limit 164 --layers 1,3,5,6 --max-new 128 --batch 32 --out /tmp/hf_out2 --drafters /tmp/moe-drafters
tail -1 $O/hf_run3.out
tar czf $OUT/moe-e2e.tgz -C $O .
cp /tmp/dk/gemm-choices-v1.json $OUT/ 2>/dev/null  # the GEMM choices tuned on this GPU
echo "== e2e done $(( $(date +%s) - T0 )) s"
# 4. memory
Q30=/tmp/moe B=$B timeout $(( 470 - ($(date +%s) - T0) )) bash tools/bench/memory_device.sh > $OUT/memory.txt 2>&1
echo "== memory rc=$? $(( $(date +%s) - T0 )) s"; cat $OUT/memory.txt | tail -20
tar czf $OUT/memory.tgz -C /tmp/o . 2>/dev/null
