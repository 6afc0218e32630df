#!/usr/bin/env bash
# The whole test suite from a fresh clone: fixtures, wasm plugins, then every cargo test.
# CUDA tests skip themselves (with a message) on machines without an NVIDIA driver; browser
# tests need Debian's chromium + chromium-driver (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-fixtures.sh
bash scripts/fetch-tokenizer-fixtures.sh
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
# componentize-py for the Python plugin tests (host/plugin-host/tests/python.rs), pinned by hash.
command -v componentize-py >/dev/null || [[ -x "$HOME/.local/bin/componentize-py" ]] ||
  python3 -m pip install --quiet --user --require-hashes -r scripts/requirements-plugins.txt
bash plugins/build.sh
cargo test --workspace --no-fail-fast "$@"
