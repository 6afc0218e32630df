#!/usr/bin/env bash
# Session 24, device call 2 (issue 34 item 4): one 32k-token prompt on a MoE target, for each of
# Qwen3-30B-A3B's and gpt-oss-20b's shapes (8 layers each, random weights built here): `generate
# --gen-batch 1` with the device memory sampled every 100 ms against `inspect`'s estimate at the
# same lengths, the process's peak host memory (time -v), the timeline. Plus gpt-oss decoding at
# --gen-batch 64 (164 prompts), for the decode step at batch 64 and the estimate there.
#   B=target-carry/s24 bash docs/bench-logs/s24-2026-12-06/scripts/call2.sh
set -u
B=${B:-target-carry/s24}
T0=$(date +%s)
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
long() { # NAME TARGET
  local n=$1 m=$2
  python3 tools/bench/make_long_prompt.py $m /tmp/long-$n.jsonl 32000
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $O/$n.smi & local smi=$!
  DRAFTLENS_CACHE=/tmp/c-$n /usr/bin/time -v timeout 150 $B/draftlens generate --backend cuda --target $m --prompts /tmp/long-$n.jsonl --gen-batch 1 --max-new-tokens 128 --timeline > $O/$n.out 2> $O/$n.err
  echo "$n rc=$?"; kill $smi
  grep -E "timeline|generate: |Maximum resident|Elapsed|error" $O/$n.err
  $B/draftlens inspect $m --json --gen-batch 1 --prompt-tokens 32100 --max-new-tokens 128 > $O/$n.inspect.json
  python3 - $O/$n.smi $O/$n.inspect.json <<'PY'
import json, sys
used = [int(l) for l in open(sys.argv[1]) if l.strip().isdigit()]
est = json.load(open(sys.argv[2]))["cuda_memory"]
print(f"device used: idle {used[0]} MiB, peak {max(used)} MiB; estimate {est['total_bytes'] / 2**20:.0f} MiB "
      f"(weights {est['weights_bytes'] / 2**20:.0f}, KV/state {est['kv_state_bytes'] / 2**20:.0f}, "
      f"prefill {est['prefill_bytes'] / 2**20:.0f}, target pass {est['target_pass_bytes'] / 2**20:.0f})")
PY
  head -c 300 $O/$n.out; echo
}
python3 tools/bench/make_random_target.py --out /tmp/q30 --arch qwen3-30b-a3b-8l --drafters 0 > $O/make-q30.log 2>&1; tail -1 $O/make-q30.log
long q30_32k /tmp/q30
rm -rf /tmp/q30
echo "== $(( $(date +%s) - T0 )) s"
python3 tools/bench/make_random_target.py --out /tmp/g20 --arch gpt-oss-20b-8l --drafters 0 > $O/make-g20.log 2>&1; tail -1 $O/make-g20.log
long g20_32k /tmp/g20
echo "== $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $O/g20_b64.smi & SMI=$!
DRAFTLENS_CACHE=/tmp/c-b64 timeout 150 $B/draftlens generate --backend cuda --target /tmp/g20 --prompts builtin:humaneval --limit 164 --gen-batch 64 --max-new-tokens 128 --timeline > $O/g20_b64.out 2> $O/g20_b64.err
echo "g20_b64 rc=$?"; kill $SMI
grep -E "timeline|generate: |error" $O/g20_b64.err
$B/draftlens inspect /tmp/g20 --json --gen-batch 64 --max-new-tokens 128 > $O/g20_b64.inspect.json
python3 -c "
import json,sys
used=[int(l) for l in open('$O/g20_b64.smi') if l.strip().isdigit()]
e=json.load(open('$O/g20_b64.inspect.json'))['cuda_memory']
print(f'batch 64: device peak {max(used)} MiB; estimate {e[\"total_bytes\"]/2**20:.0f} MiB')"
tar czf $OUT/call2.tgz -C $O .
echo "== total $(( $(date +%s) - T0 )) s"
