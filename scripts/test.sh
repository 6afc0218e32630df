#!/usr/bin/env bash
# The whole test suite from a fresh clone: the built-in prompt sets against their pinned source,
# an offline compile of the CUDA kernels, the test build, fixtures (installed by the built binary's
# own `draftlens setup`), wasm plugins, every cargo test, then the wheel installed into a fresh
# virtual environment (scripts/test-wheel.sh).
# CUDA tests skip themselves (with a message) on machines without an NVIDIA driver; browser tests
# need Debian's chromium + chromium-driver (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/check-builtin-prompts.sh
# Every CUDA kernel compiles (NVRTC) without new register spills (ptxas): no GPU needed, so CI
# checks the kernels even when no GPU machine is lent (NVRTC + ptxas wheels pinned by hash).
bash scripts/check-kernels.sh
# The plugin host embeds the built-in plugins, built for wasm32 by its build script.
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
# The deny-all WASI tests build a probe plugin for wasm32-wasip2 (crates/plugin-host/tests/wasi.rs).
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
# Build every test target first: the `draftlens` binary among them is the one that installs the
# fixtures below and the one packed into the wheel (no second build).
cargo test --workspace --no-run "$@"
bash scripts/check-first-command.sh  # the README's first command on a toolchain without the wasm target
DRAFTLENS_BIN=target/debug/draftlens bash scripts/setup-fixtures.sh
bash scripts/fetch-tokenizer-fixtures.sh
# componentize-py for the Python plugin tests (crates/plugin-host/tests/python.rs), pinned by hash.
command -v componentize-py >/dev/null || [[ -x "$HOME/.local/bin/componentize-py" ]] ||
  python3 -m pip install --quiet --user --require-hashes -r scripts/requirements-plugins.txt
bash plugins/build.sh
cargo test --workspace --no-fail-fast "$@"
# A real single-node Slurm: 2-shard evaluation + merge through sbatch (root only; CI=true requires it).
DRAFTLENS_BIN=target/debug/draftlens bash scripts/slurm-ci.sh
# A real engine: llama.cpp built from the pinned llama-cpp-python sdist (CPU) decoding with the
# reference DFlash drafter converted by its own converter; imported, diffed, linted (docs/traces.md §7).
DRAFTLENS_BIN=target/debug/draftlens bash scripts/llamacpp-e2e.sh
DRAFTLENS_BIN=target/debug/draftlens bash scripts/test-wheel.sh
