#!/usr/bin/env bash
# Session 23, device call 3: the 32k-token prompt on the MoE target that call 2's memory check could
# not make (make_long_prompt.py read a prompt file that moved): generate with --gen-batch 1, the
# device memory sampled every 100 ms against `inspect`'s estimate at 32,100 prompt tokens. Also the
# largest prefill through the device-routed MoE layer (≈ 257k routes a layer, ≈ 4,100 groups).
#   B=target-carry/s23 bash docs/bench-logs/s23-2026-12-06/scripts/call3.sh
set -u
B=${B:-target-carry/s23}
T0=$(date +%s)
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
python3 tools/bench/make_random_target.py --out /tmp/q30 --arch qwen3-30b-a3b-8l --drafters 0 --device cuda > $O/make.log 2>&1; tail -1 $O/make.log
python3 tools/bench/make_long_prompt.py /tmp/q30 /tmp/long32k.jsonl 32000
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $O/long.smi & SMI=$!
/usr/bin/time -v timeout 150 $B/draftlens generate --backend cuda --target /tmp/q30 --prompts /tmp/long32k.jsonl --gen-batch 1 --max-new-tokens 128 --timeline > $O/long.out 2> $O/long.err
echo "long32k rc=$?"; kill $SMI
grep -E "timeline|generate: |Maximum resident|error" $O/long.err
$B/draftlens inspect /tmp/q30 --json --gen-batch 1 --prompt-tokens 32100 --max-new-tokens 128 > $O/long.inspect.json
python3 - $O/long.smi $O/long.inspect.json <<'PY'
import json, sys
used = [int(l) for l in open(sys.argv[1]) if l.strip().isdigit()]
est = json.load(open(sys.argv[2]))["cuda_memory"]
print(f"device used: idle {used[0]} MiB, peak {max(used)} MiB; estimate {est['total_bytes'] / 2**20:.0f} MiB "
      f"(weights {est['weights_bytes'] / 2**20:.0f}, KV/state {est['kv_state_bytes'] / 2**20:.0f}, "
      f"prefill {est['prefill_bytes'] / 2**20:.0f}, target pass {est['target_pass_bytes'] / 2**20:.0f})")
PY
head -c 600 $O/long.out; echo
tar czf $OUT/call3.tgz -C $O .
echo "== total $(( $(date +%s) - T0 )) s"
