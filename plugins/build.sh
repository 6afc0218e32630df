#!/usr/bin/env bash
# Build the built-in metric plugins as WebAssembly components into plugins/dist/ (git-ignored).
#
# Plugins are compiled for wasm32-unknown-unknown and linked by the wasm-component-ld that rustup
# ships with the toolchain, so the components import nothing but draftlens:metric/host (no WASI).
# Usage: plugins/build.sh [--out DIR]
#
# draftlens itself does not need this: crates/plugin-host/build.rs builds the same plugins into the
# same folder (<target>/wasm-builtins) and embeds them in the binary. plugins/dist is for
# developers (e.g. to pass a plugin by path); its files are byte for byte the embedded ones.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/plugins/dist"
if [[ "${1:-}" == "--out" ]]; then OUT="$2"; fi

PLUGINS=(accept-length acceptance ddtree masked-accuracy replayed-tau sampling top1-accuracy topk)

rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
if ! rustc --print target-list | grep -qx wasm32-unknown-unknown || \
   [[ ! -d "$(rustc --print sysroot)/lib/rustlib/wasm32-unknown-unknown" ]]; then
  echo "error: the wasm32-unknown-unknown target is not installed (rustup target add wasm32-unknown-unknown)" >&2
  exit 1
fi
HOST="$(rustc -vV | sed -n 's/^host: //p')"
LD="$(rustc --print sysroot)/lib/rustlib/$HOST/bin/wasm-component-ld"
if [[ ! -x "$LD" ]]; then
  echo "error: $LD not found: this toolchain does not ship wasm-component-ld (Rust >= 1.82 does)" >&2
  exit 1
fi

# The folder crates/plugin-host/build.rs uses, with the same settings: each reuses the other's work.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/wasm-builtins"
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER="$LD"
# Size/speed settings for plugins only (the workspace's release profile stays as it is).
export CARGO_PROFILE_RELEASE_LTO=true CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 CARGO_PROFILE_RELEASE_STRIP=debuginfo

args=()
for p in "${PLUGINS[@]}"; do args+=(-p "metric-$p"); done
(cd "$ROOT" && cargo build --release --target wasm32-unknown-unknown "${args[@]}")

mkdir -p "$OUT"
for p in "${PLUGINS[@]}"; do
  cp "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/metric_${p//-/_}.wasm" "$OUT/$p.wasm"
done
ls -l "$OUT"/*.wasm
