#!/usr/bin/env bash
# Type-checks the library (engine included) and binary for Apple Silicon. Upstream mlx-sys
# cannot build on Linux, so our mlx-sys build script runs in check-only mode for this target
# (bindgen only, nothing compiled or linked). macOS users build upstream mlx-sys with Metal.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# The bundle's icons and Info.plist (top-level icons/ and Info.plist) are read only when a
# Mac bundles the app: check here that every path tauri.conf.json gives resolves.
python3 - <<'PY'
import json, pathlib, sys
conf = json.load(open("src-tauri/tauri.conf.json"))
paths = conf["bundle"]["icon"] + [conf["bundle"]["macOS"]["infoPlist"]]
missing = [p for p in paths if not (pathlib.Path("src-tauri") / p).is_file()]
sys.exit(f"tauri.conf.json names missing files: {missing}" if missing else 0)
PY
if [ "$(uname -s)" = Darwin ]; then
  cargo clippy --all-targets -- -D warnings
  exit 0
fi
rustup target list --installed 2>/dev/null | grep -qx aarch64-apple-darwin || rustup target add aarch64-apple-darwin
# clippy, not just check: the macOS-only FFI is held to the same lints (documented unsafe).
cargo clippy --target aarch64-apple-darwin --lib --bins -- -D warnings
# The menu-bar app. objc2's exception helper compiles a little Objective-C: clang can do
# that for Apple targets without an SDK. The notification plugin's macOS backend needs the
# Cocoa SDK, so it alone is left out here (feature `notifications`); on a Mac it is built.
CC_aarch64_apple_darwin=clang cargo clippy --target aarch64-apple-darwin -p mlxbar-app --no-default-features --lib --bins -- -D warnings
echo "macOS (aarch64-apple-darwin) type-check and lints passed (app without its notification plugin)"
