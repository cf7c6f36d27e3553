#!/usr/bin/env bash
# The whole test suite: fetches the default model, runs every Rust test (unit and
# integration, on the real MLX engine), then type-checks the macOS code.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# Tests run the release profile: the engine in a debug build is too slow to be useful.
cargo build --release --bin mlxbar
./target/release/mlxbar fetch-model >/dev/null
./target/release/mlxbar doctor
cargo test --release --lib --bins --tests -- --test-threads=2
cargo bench --no-run   # benches must keep compiling
bash scripts/check-macos.sh
