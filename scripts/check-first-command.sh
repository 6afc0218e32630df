#!/usr/bin/env bash
# Fails when the README's first command, ./scripts/demo.sh, would fail on a fresh machine that has
# only a Rust toolchain (rustup's stable, no extra target). Run by scripts/test.sh after the test
# build; takes about a second.
#
# Why this check and not a real fresh install: the bug it guards against (issue 39) was demo.sh
# building without the wasm32-unknown-unknown target, which crates/plugin-host/build.rs needs for
# the built-in plugins; CI never saw it because .ci/run installs that target before anything runs.
# A clean RUSTUP_HOME/CARGO_HOME would mean a second toolchain download and a 12-minute release
# build on CI's 2 cores, on top of ~20 minutes of tests. What failed is cheap to check without one:
#
# 1. demo.sh's setup, on a toolchain that lacks the target: demo.sh runs against shims of rustc,
#    rustup and cargo (rustc reports a sysroot without the target, rustup installs it there, cargo
#    fails as build.rs does unless it is there, and the built "draftlens" only records its
#    arguments). It must install the target before it builds, then run `setup` and `demo`; and
#    without rustup it must stop with one error line instead of a 12-minute build.
# 2. What a user sees if they build without the target anyway: the real, already compiled build
#    script of draftlens-plugin-host, run with a rustc that reports a sysroot without the target,
#    must print one cargo error line that names the fix, and no panic.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check-first-command: FAILED: $*" >&2; exit 1; }
real_rustc="$(command -v rustc)"

# A checkout holding only demo.sh: whatever it writes stays in $tmp.
mkdir -p "$tmp/repo/scripts" "$tmp/bin" "$tmp/bin-no-rustup" "$tmp/sysroot/lib/rustlib"
cp "$root/scripts/demo.sh" "$tmp/repo/scripts/demo.sh"
log="$tmp/log"
wasm_dir="$tmp/sysroot/lib/rustlib/wasm32-unknown-unknown"

cat >"$tmp/bin/rustc" <<EOF
#!/usr/bin/env bash
if [ "\$*" = "--print sysroot" ]; then echo "$tmp/sysroot"; else exec "$real_rustc" "\$@"; fi
EOF
cat >"$tmp/bin/rustup" <<EOF
#!/usr/bin/env bash
echo "rustup \$*" >>"$log"
if [ "\$*" = "target add wasm32-unknown-unknown" ]; then mkdir -p "$wasm_dir"; fi
EOF
# cargo build: fails as crates/plugin-host/build.rs does when the target is missing.
cat >"$tmp/bin/cargo" <<EOF
#!/usr/bin/env bash
echo "cargo \$*" >>"$log"
if [ ! -d "$wasm_dir" ]; then
  echo "error: draftlens-plugin-host: the wasm32-unknown-unknown target is not installed" >&2
  exit 101
fi
mkdir -p "\$CARGO_TARGET_DIR/release"
printf '#!/usr/bin/env bash\necho "draftlens \$*" >>"%s"\n' "$log" >"\$CARGO_TARGET_DIR/release/draftlens"
chmod +x "\$CARGO_TARGET_DIR/release/draftlens"
EOF
cp "$tmp/bin/rustc" "$tmp/bin/cargo" "$tmp/bin-no-rustup/"
chmod +x "$tmp"/bin/* "$tmp"/bin-no-rustup/*

# 1a. The target is missing: demo.sh installs it, then builds, then runs setup and demo.
: >"$log"
PATH="$tmp/bin:$PATH" CARGO_TARGET_DIR="$tmp/target" bash "$tmp/repo/scripts/demo.sh" \
  >"$tmp/out" 2>&1 || fail "demo.sh failed on a toolchain without the wasm target:$(echo; cat "$tmp/out")"
want="rustup target add wasm32-unknown-unknown
cargo build --release -p draftlens-cli
draftlens setup
draftlens demo --backend auto"
[ "$(cat "$log")" = "$want" ] ||
  fail "demo.sh did not install the wasm target before building; it ran:$(echo; cat "$log")"

# 1b. The target is there now: nothing to install.
: >"$log"
PATH="$tmp/bin:$PATH" CARGO_TARGET_DIR="$tmp/target" DEMO_LIMIT=3 bash "$tmp/repo/scripts/demo.sh" \
  >"$tmp/out" 2>&1 || fail "demo.sh failed with the wasm target installed:$(echo; cat "$tmp/out")"
[ "$(head -1 "$log")" = "cargo build --release -p draftlens-cli" ] ||
  fail "demo.sh called rustup although the target was installed:$(echo; cat "$log")"
grep -qx "draftlens demo --backend auto --limit 3" "$log" || fail "DEMO_LIMIT was not passed on:$(echo; cat "$log")"

# 1c. No rustup to install it with: one error line, before any build.
rm -rf "$wasm_dir"
: >"$log"
if PATH="$tmp/bin-no-rustup:/usr/bin:/bin" command -v rustup >/dev/null; then
  echo "check-first-command: rustup is in /usr/bin or /bin; the no-rustup case is not checked" >&2
else
  if PATH="$tmp/bin-no-rustup:/usr/bin:/bin" CARGO_TARGET_DIR="$tmp/target" \
    bash "$tmp/repo/scripts/demo.sh" >"$tmp/out" 2>&1; then
    fail "demo.sh succeeded without the wasm target and without rustup"
  fi
  [ ! -s "$log" ] || fail "demo.sh built without the wasm target:$(echo; cat "$log")"
  [ "$(grep -c . "$tmp/out")" = 1 ] && grep -q '^error: .*wasm32-unknown-unknown.*rustup' "$tmp/out" ||
    fail "without rustup, demo.sh must print one error line naming the fix; it printed:$(echo; cat "$tmp/out")"
fi

# 2. The build script itself, as cargo runs it, on a toolchain without the target.
# The newest one: the one the test build just compiled (older ones may linger in a local target).
target_dir="${CARGO_TARGET_DIR:-$root/target}"
script="$(ls -t "$target_dir"/{debug,release}/build/draftlens-plugin-host-*/build-script-build 2>/dev/null | head -1 || true)"
[ -n "$script" ] ||
  fail "no compiled build script of draftlens-plugin-host under $target_dir: build the tests first (cargo test --no-run)"
status=0
CARGO_MANIFEST_DIR="$root/crates/plugin-host" OUT_DIR="$tmp" RUSTC="$tmp/bin/rustc" \
  "$script" >"$tmp/stdout" 2>"$tmp/stderr" || status=$?
errors="$(grep '^cargo::error=' "$tmp/stdout" || true)"
[ "$(printf '%s' "$errors" | grep -c .)" = 1 ] && [ "$status" = 0 ] && [ ! -s "$tmp/stderr" ] &&
  printf '%s' "$errors" | grep -q 'wasm32-unknown-unknown.*rustup target add wasm32-unknown-unknown' ||
  fail "$script without the wasm target must log one cargo::error line naming the fix (and nothing on
stderr, no panic, so that cargo shows just that line); exit status $status, stdout:
$(cat "$tmp/stdout")
stderr:
$(cat "$tmp/stderr")"
echo "check-first-command: demo.sh installs the wasm target before building; a build without it is one error line"
