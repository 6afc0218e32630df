#!/usr/bin/env bash
# Session 19, issue 37 ("behaviour unchanged") on the GPU: the release binaries of a3ac290 (before the
# crates/ restructuring) and of this session's main run the same `draftlens run --backend cuda` and
# `draftlens live --backend cuda` over a random Qwen3-8B-shaped target (tools/bench/make_random_target.py)
# and two 5-layer DFlash drafters, each binary with its own empty data folder and hidden-state cache.
# They share the NVRTC kernel cache and its GEMM algorithm choices (the kernels are unchanged; timing-based
# choices made in two processes could otherwise differ for reasons that are not the code). Their
# databases must have the same digest (tools/arch/run_digest.py: records, prompts, metrics, identity).
# The two binaries do not fit one call's 64 MiB with the tree, so the script runs in two calls within the
# machine's warm period (the target and the first database stay in /tmp). From the repository root:
#   VARIANTS=base B=target-carry/s19 bash docs/bench-logs/s19-2026-12-06/scripts/call1.sh   # call 1
#   VARIANTS=new  B=target-carry/s19 bash docs/bench-logs/s19-2026-12-06/scripts/call1.sh   # call 2: + compare
set -u
B=${B:-target-carry/s19}
source tools/bench/device_env.sh
[ -d /tmp/q8b ] || { python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 2 > $O/make.log 2>&1; echo "make rc=$?"; }
for v in ${VARIANTS:-base new}; do
  export DRAFTLENS_DATA=/tmp/data-$v DRAFTLENS_CACHE=/tmp/cache-$v
  /usr/bin/time -f "%e s %M KB" timeout 200 $B/draftlens-$v run --backend cuda --target /tmp/q8b \
    --drafter /tmp/q8b-drafters --prompts builtin:humaneval --limit 64 --db /tmp/$v.sqlite --json \
    > $O/run-$v.json 2> $O/run-$v.err; echo "$v run rc=$? $(tail -1 $O/run-$v.err)"
  timeout 200 $B/draftlens-$v live --backend cuda --target /tmp/q8b --drafter /tmp/q8b-drafters/step-1 \
    --prompts builtin:humaneval --limit 8 --max-new-tokens 64 --json > $O/live-$v.json 2> $O/live-$v.err
  echo "$v live rc=$?"; cp $O/live-$v.json /tmp/live-$v.json
done
[ -e /tmp/base.sqlite ] && [ -e /tmp/new.sqlite ] || { tar czf $OUT/all.tgz -C $O .; exit 0; }
cp /tmp/live-base.json /tmp/live-new.json $O/
python3 tools/arch/run_digest.py /tmp/base.sqlite /tmp/new.sqlite
python3 - "$O" <<'PY'
import json, sys
o = sys.argv[1]
def strip(x):
    # Wall times differ from run to run; everything else must be equal.
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items()
                if not any(w in k for w in ("time", "elapsed", "sec", "_s", "per_s", "rss"))}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
try:
    a, b = (strip(json.load(open(f"{o}/live-{v}.json"))) for v in ("base", "new"))
except Exception as e:
    sys.exit(f"live --json unreadable: {e}")
same = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
print("live --json identical (wall times left out):", same)
if not same:
    print("base:", json.dumps(a)[:600]); print("new: ", json.dumps(b)[:600])
PY
for t in cuda_ops cuda_decode cuda_attention cuda_gdn; do
  [ -x $B/$t ] || continue
  timeout 150 $B/$t --test-threads=1 > $O/$t.log 2>&1; echo "$t rc=$?"
  grep -E "test result|FAILED|panicked" $O/$t.log | head -5
done
tar czf $OUT/all.tgz -C $O .
