#!/usr/bin/env bash
# The whole test suite: fetches the default model, runs every Rust test (unit and
# integration, on the real MLX engine), then type-checks the macOS code.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# Tools the tests run for real: Prometheus (scrapes a live server) and promtool.
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  if [ "$(uname -s)" = Darwin ]; then brew install prometheus
  else
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus >/dev/null
  fi
fi
# Tests run the release profile: the engine in a debug build is too slow to be useful.
cargo build --release --bin mlxbar
./target/release/mlxbar fetch-model >/dev/null
./target/release/mlxbar doctor
cargo test --release --lib --bins --tests -- --test-threads=2
cargo bench --no-run   # benches must keep compiling
bash scripts/check-macos.sh
