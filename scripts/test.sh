#!/usr/bin/env bash
# The whole test suite: fetches the default model, runs every Rust test (unit and
# integration, on the real MLX engine; the menu-bar app on a virtual desktop), the
# popover's browser tests, then type-checks the macOS code.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
say() { printf '\033[1m[test]\033[0m %s\n' "$*"; }

# Tools the tests run for real: Prometheus and promtool; Xvfb, a D-Bus session bus, the
# dunst notification daemon, the trayer tray host, xdotool and ImageMagick for the app on a
# virtual desktop; Chromium and Node.js for the popover's browser tests. (Python with venv,
# which the official client SDKs run in, comes with scripts/setup.sh.)
if [ "$(uname -s)" = Darwin ]; then
  command -v prometheus >/dev/null || brew install prometheus
  command -v node >/dev/null || brew install node
else
  need=()
  for pair in prometheus:prometheus promtool:prometheus Xvfb:xvfb dbus-daemon:dbus dunst:dunst dunstctl:dunst \
              trayer:trayer xdotool:xdotool import:imagemagick chromium:chromium node:nodejs npm:npm curl:curl; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
  done
  if [ ${#need[@]} -gt 0 ]; then
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    say "installing test tools: ${need[*]}"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
  fi
fi

# Each phase prints its wall time, so a change sees what it costs (README's Tests section).
phase() {
  local name=$1; shift
  local t0=$SECONDS
  say "$name"
  "$@"
  say "$name: $((SECONDS - t0)) s"
}

# rustup's default profile has both; a minimal profile does not.
if command -v rustup >/dev/null; then rustup component add rustfmt clippy 2>&1 | grep -v "is up to date" || true; fi
phase "format (rustfmt.toml)" cargo fmt --all --check
phase "lints (Cargo.toml: every unsafe block documented)" cargo clippy --release --workspace --all-targets -- -D warnings
# Tests run the release profile (the engine in a debug build is too slow to be useful).
# One build for the tests and the benches (same profile and features), so the benches
# keep compiling at no second build's cost; the binaries it makes carry the test hooks.
phase "test build" cargo test --release --workspace --lib --bins --tests --benches --no-run
./target/release/mlxbar fetch-model >/dev/null
say "client SDKs for the API tests (openai, in a venv; scripts/sdk-venv.sh)"
bash scripts/sdk-venv.sh >/dev/null
phase "Rust tests" cargo test --release --workspace --lib --bins --tests --no-fail-fast -- --test-threads=2
# What `make run` builds: without the test hooks (a test build's binary must not be what
# a user runs). The browser tests then run on that binary.
phase "release build (make build)" cargo build --release --workspace --bins
doctor=$(./target/release/mlxbar doctor)
echo "$doctor"
grep -q "^test hooks  not compiled in" <<<"$doctor" || { echo "the release binary carries the test hooks" >&2; exit 1; }
phase "popover browser tests (Playwright + Chromium)" bash -c 'cd ui && npm ci --no-audit --no-fund --loglevel=error && npm test'
phase "macOS type-check and lints" bash scripts/check-macos.sh
say "screenshots of the popover and the app are in test-artifacts/"
