#!/usr/bin/env bash
# A real single-node Slurm (docs/scale-out.md §4): installs Debian's slurmctld, slurmd,
# slurm-client and munge (pinned versions; apt checks every .deb's sha256 against Debian's signed
# Release file), starts munged, slurmctld and slurmd with a minimal private configuration for this
# machine, runs a 2-shard CPU evaluation plus its merge through `draftlens slurm --submit`
# (sbatch job array + merge job with --dependency=afterok), waits for both, and checks that every
# metric row of the merged run equals the unsharded run's, bit for bit. Then `draftlens watch
# --slurm --once` over a folder of two reference checkpoints and one that is not a drafter: one
# job per checkpoint, both runs in the watcher's database with every metric row equal to
# `draftlens run` on the checkpoint, the third job recorded as failed, and a restarted watcher
# submits nothing.
#
# Needs root (to install packages and start the daemons). Not root: skips with a message, except
# under CI=true, where it fails. Called by scripts/test.sh after the test build and the fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${DRAFTLENS_BIN:-target/debug/draftlens}")
SLURM_VERSION=22.05.8-4+deb12u3
MUNGE_VERSION=0.5.15-2+deb12u1
start=$(date +%s)

unavailable() {
  if [[ "${CI:-}" == "true" ]]; then
    echo "slurm-ci: FAILED: $* (CI=true: the Slurm test must run here)" >&2
    exit 1
  fi
  echo "slurm-ci: skipped: $*"
  exit 0
}
[[ $(id -u) -eq 0 ]] || unavailable "needs root to install and start slurmctld, slurmd and munged"
[[ -x "$BIN" ]] || { echo "slurm-ci: $BIN is missing: build it first (cargo build)" >&2; exit 1; }

if ! command -v sbatch >/dev/null || ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
  ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "slurmctld=$SLURM_VERSION" "slurmd=$SLURM_VERSION" "slurm-client=$SLURM_VERSION" \
    "munge=$MUNGE_VERSION" >/dev/null ||
    unavailable "cannot install slurm $SLURM_VERSION and munge $MUNGE_VERSION (update the pins in $0)"
fi

tmp=$(mktemp -d /tmp/draftlens-slurm-ci.XXXXXX)
cleanup() {
  local f pid
  for f in "$tmp/slurmd.pid" "$tmp/slurmctld.pid" ${started_munge:+/run/munge/munged.pid}; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || continue
    # The daemons save their state on the way out: wait before removing their folders.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

# ---- munge (authentication between the Slurm daemons and clients)
mkdir -p /run/munge /etc/munge
chown munge:munge /run/munge
[[ -f /etc/munge/munge.key ]] || mungekey -c
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  su -s /bin/sh munge -c /usr/sbin/munged
  started_munge=1
fi

# ---- a private slurm.conf (SLURM_CONF: /etc/slurm is left alone), one node with every CPU
h=$(hostname -s)
export SLURM_CONF="$tmp/slurm.conf"
mkdir -p "$tmp/ctld" "$tmp/d"
cat >"$SLURM_CONF" <<CONF
ClusterName=draftlensci
SlurmctldHost=$h
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
StateSaveLocation=$tmp/ctld
SlurmdSpoolDir=$tmp/d
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ReturnToService=2
NodeName=$h CPUs=$(nproc) State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 1
done
sinfo -h -o %T | grep -q idle || { cat "$tmp"/slurm*.log >&2; echo "slurm-ci: the node never became idle" >&2; exit 1; }
echo "slurm-ci: Slurm up in $(( $(date +%s) - start )) s ($(sinfo -h -o '%P %D node(s) %c CPUs %T'))"

# ---- the evaluation: the default test target, the reference drafter, 4 prompts, 8 tokens
prompts="$tmp/prompts.jsonl"
cat >"$prompts" <<'JSONL'
{"id": "rev", "category": "code", "messages": [{"role": "user", "content": "Write a Python function that reverses a string."}]}
{"id": "sum", "category": "math", "messages": [{"role": "user", "content": "What is the sum of the first ten positive integers? Show the steps."}]}
{"id": "tea", "messages": [{"role": "user", "content": "Give three tips for brewing good tea."}]}
{"id": "sky", "messages": [{"role": "user", "content": "Why is the sky blue? Explain it to a child."}]}
JSONL
base_opts=(--backend cpu --target "$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf" --prompts "$prompts"
  --max-new-tokens 8 --plugin accept-length)
run_opts=("${base_opts[@]}" --drafter "$PWD/drafters/smollm2-reference/step-2581")
"$BIN" --cache-dir "$tmp/cache-full" run "${run_opts[@]}" --db "$tmp/full.sqlite" >/dev/null
t_eval=$(date +%s)

# The shards compute everything anew (their own cache, shared by the two tasks).
out=$("$BIN" --json --cache-dir "$tmp/cache-slurm" slurm --shards 2 --gpus 0 --cpus-per-task 1 --partition ci \
  --dir "$tmp/job" --submit -- "${run_opts[@]}")
array=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["array_job"])' <<<"$out")
merge=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["merge_job"])' <<<"$out")
echo "slurm-ci: submitted array job $array (2 tasks) and merge job $merge (afterok:$array)"
for _ in $(seq 600); do
  [[ -z "$(squeue -h -j "$array,$merge" 2>/dev/null)" ]] && break
  sleep 1
done
if [[ -n "$(squeue -h -j "$array,$merge" 2>/dev/null)" ]]; then
  squeue >&2
  echo "slurm-ci: the jobs did not finish within 600 s" >&2
  exit 1
fi
show_logs() { tail -n 20 "$tmp"/job/logs/* >&2 || true; }
[[ -f "$tmp/job/merged.sqlite" ]] || { show_logs; echo "slurm-ci: no merged database" >&2; exit 1; }

# ---- every metric row of the merged run equals the unsharded run's (values as stored, exactly)
python3 - "$tmp/full.sqlite" "$tmp/job/merged.sqlite" <<'PY' || { show_logs; exit 1; }
import sqlite3, sys
def rows(db, where):
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    runs = c.execute(f"SELECT id, status, num_prompts FROM run {where}").fetchall()
    assert len(runs) == 1 and runs[0][1] == "complete", f"{db}: runs {runs}"
    m = c.execute("SELECT source, name, scope, value, count, series_json FROM metric WHERE run_id = ? "
                  "ORDER BY source, name, scope", (runs[0][0],)).fetchall()
    return runs[0][2], m
full = rows(sys.argv[1], "")
merged = rows(sys.argv[2], "WHERE origin = 'merge'")
assert full[0] == merged[0] == 4, (full[0], merged[0])
assert any(r[0] == "native" and r[1] == "tau_replayed_macro" for r in full[1]), full[1]
assert any(r[0] == "accept-length" for r in full[1]), "the plugin's rows are missing"
if full[1] != merged[1]:
    for a, b in zip(full[1], merged[1]):
        if a != b:
            print("differs:", a, b, file=sys.stderr)
    sys.exit(f"slurm-ci: merged metrics differ from the unsharded run ({len(full[1])} vs {len(merged[1])} rows)")
print(f"slurm-ci: merged run equals the unsharded run ({len(full[1])} metric rows)")
PY
t_merge=$(date +%s)

# ---- watch --slurm: a training folder with two checkpoints; each becomes a job (the cache of the
# unsharded run holds the target's states: the jobs only draft)
train="$tmp/train"
for step in 258 903; do
  mkdir -p "$train/step-$step"
  cp "drafters/smollm2-reference/step-$step/config.json" "drafters/smollm2-reference/step-$step/model.safetensors" \
    "$train/step-$step/"
done
# A checkpoint that is complete on disk but not a drafter (its config has no model in it): its job
# fails, and the watcher records that.
mkdir -p "$train/step-600"
echo '{}' >"$train/step-600/config.json"
cp drafters/smollm2-reference/step-258/model.safetensors "$train/step-600/"
watch_cmd=("$BIN" --json --cache-dir "$tmp/cache-full" watch "$train" --drafter-series train --db "$tmp/watch.sqlite"
  --settle 0 --poll 1 --once --slurm --gpus 0 --cpus-per-task 1 --partition ci "${base_opts[@]}")
timeout 600 "${watch_cmd[@]}" >"$tmp/watch.jsonl" ||
  { cat "$tmp/watch.jsonl" >&2; tail -n 20 "$tmp"/watch.sqlite.slurm/logs/* >&2 || true; echo "slurm-ci: watch --slurm failed" >&2; exit 1; }
grep -c '"event":"submitted"' "$tmp/watch.jsonl" | grep -qx 3 ||
  { cat "$tmp/watch.jsonl" >&2; echo "slurm-ci: watch --slurm did not submit 3 jobs" >&2; exit 1; }
# Restarted: the checkpoints are remembered with their jobs; nothing is submitted again.
timeout 120 "${watch_cmd[@]}" >"$tmp/watch2.jsonl"
if grep -q '"event":"submitted"' "$tmp/watch2.jsonl"; then
  cat "$tmp/watch2.jsonl" >&2; echo "slurm-ci: a restarted watcher submitted again" >&2; exit 1
fi
for step in 258 903; do
  "$BIN" --cache-dir "$tmp/cache-full" run "${base_opts[@]}" --drafter "$train/step-$step" --drafter-series train \
    --db "$tmp/ref.sqlite" >/dev/null
done
python3 - "$tmp/ref.sqlite" "$tmp/watch.sqlite" <<'PY' || { cat "$tmp/watch.jsonl" >&2; tail -n 20 "$tmp"/watch.sqlite.slurm/logs/* >&2 || true; exit 1; }
import sqlite3, sys
def runs(db):
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    out = {}
    for rid, step, status, series, origin in c.execute(
            "SELECT id, drafter_step, status, drafter_series, origin FROM run"):
        assert status == "complete" and series == "train", (db, rid, status, series)
        assert "watch" not in db or origin.startswith("import:slurm-job-"), (db, rid, origin)
        out[step] = c.execute("SELECT source, name, scope, value, count, series_json FROM metric WHERE run_id = ? "
                              "ORDER BY source, name, scope", (rid,)).fetchall()
    return out, c
ref, _ = runs(sys.argv[1])
got, c = runs(sys.argv[2])
assert sorted(ref) == sorted(got) == [258, 903], (sorted(ref), sorted(got))
for step in ref:
    assert any(r[0] == "accept-length" for r in ref[step]), "the plugin's rows are missing"
    if ref[step] != got[step]:
        sys.exit(f"slurm-ci: step {step}: the watch --slurm run differs from draftlens run")
w = c.execute("SELECT step, status, slurm_job, message FROM watch_checkpoint ORDER BY step").fetchall()
assert [(s, st) for s, st, _, _ in w] == [(258, "evaluated"), (600, "failed"), (903, "evaluated")], w
assert all(j for _, _, j, _ in w), w
assert "FAILED" in w[1][3] and "log:" in w[1][3], w[1][3]
print(f"slurm-ci: watch --slurm: 3 jobs ({', '.join(j for _, _, j, _ in w)}); the runs equal draftlens run's "
      f"({len(ref[258])} metric rows each); the broken checkpoint's is recorded as failed: {w[1][3]}")
PY
end=$(date +%s)
echo "slurm-ci: passed in $((end - start)) s (unsharded run $((t_eval - start)) s incl. Slurm start; sbatch array + merge $((t_merge - t_eval)) s; watch --slurm $((end - t_merge)) s)"
