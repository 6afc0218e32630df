#!/usr/bin/env bash
# Device check of the memory estimate and the refusal (docs/loading.md §5, issue 34 item 4). Not
# run before session 23. From the repository root on the GPU machine, with
# the carried binary and tokenizer of tools/bench/device_env.sh:
#   B=target-carry/x bash tools/bench/memory_device.sh
# 1. Refusal on the real GPU: Qwen3.5-122B-A10B in bf16 (tools/bench/sparse_checkpoint.py: its real
#    layout, the 227 GiB of data a hole in a sparse file) must exit 1 from `generate --backend cuda`
#    in about a second with the one-line "does not fit" message and the driver's free memory, no
#    weight read (its time and the process's peak RSS say so).
# 2. The estimate against what the GPU holds: a random Qwen3-30B-A3B-shaped target (8 of 48 layers,
#    tools/bench/make_random_target.py) decoding HumanEval at --gen-batch 64 and one 32k-token prompt
#    at batch 1; device memory used sampled by nvidia-smi every 100 ms, printed next to
#    `inspect --json`'s cuda_memory at the same batch and lengths (the estimate is an upper bound:
#    the peak less the context's few hundred MiB should stay under it, and not far under).
set -u
source tools/bench/device_env.sh
DL="$B/draftlens"

python3 tools/bench/sparse_checkpoint.py /tmp/sparse122 --model 122b
/usr/bin/time -v timeout 120 "$DL" generate --backend cuda --target /tmp/sparse122 \
  --prompts builtin:humaneval --limit 4 > "$O/refuse.out" 2> "$O/refuse.err"
echo "refusal rc=$? (want 1)"
grep -E "does not fit|Maximum resident|Elapsed" "$O/refuse.err"

# Q30: an existing target of that shape to reuse (another script of the same call made it).
Q30=${Q30:-/tmp/q30}
[ -e "$Q30/config.json" ] || python3 tools/bench/make_random_target.py --out "$Q30" --arch qwen3-30b-a3b-8l \
  --drafters 0 --device cuda > "$O/make_target.log" 2>&1 || { echo "make_random_target failed"; tail "$O/make_target.log"; }
python3 tools/bench/make_long_prompt.py "$Q30" /tmp/long32k.jsonl 32000 > /dev/null

measure() { # NAME PROMPTS BATCH PROMPT_TOKENS (for the estimate)
  local n=$1 prompts=$2 batch=$3 len=$4
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$O/$n.smi" &
  local smi=$!
  "$DL" generate --backend cuda --target "$Q30" --prompts "$prompts" --gen-batch "$batch" \
    --max-new-tokens 128 --cache-dir "/tmp/cache-$n" --timeline > "$O/$n.out" 2> "$O/$n.err"
  echo "$n rc=$?"
  kill $smi
  "$DL" inspect "$Q30" --json --gen-batch "$batch" --prompt-tokens "$len" \
    --max-new-tokens 128 > "$O/$n.inspect.json"
  python3 - "$O/$n.smi" "$O/$n.inspect.json" <<'EOF'
import json, sys
used = [int(l) for l in open(sys.argv[1]) if l.strip().isdigit()]
est = json.load(open(sys.argv[2]))["cuda_memory"]
print(f"  device used: idle {used[0]} MiB, peak {max(used)} MiB; estimate {est['total_bytes'] / 2**20:.0f} MiB "
      f"(weights {est['weights_bytes'] / 2**20:.0f}, KV/state {est['kv_state_bytes'] / 2**20:.0f}, "
      f"prefill {est['prefill_bytes'] / 2**20:.0f}, target pass {est['target_pass_bytes'] / 2**20:.0f})")
EOF
}
# HumanEval prompts are at most ~600 tokens with the chat template: the estimate at 640.
measure humaneval64 builtin:humaneval 64 640
measure long32k /tmp/long32k.jsonl 1 32100
