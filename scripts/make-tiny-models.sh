#!/usr/bin/env bash
# Regenerates tests/data/tiny/ (tiny random-weight models of every supported architecture
# and their mlx-lm reference outputs, for tests/architectures.rs; needs Python, the tests
# themselves do not). Installs mlx-lm 0.32.2 and mlx 0.32.4 (the pins of
# ../shared/peers/setup.sh, which made tests/data/reference.json), plus gguf-py for the GGUF
# copies, in a venv under DIR, then runs
# scripts/reference/make_tiny_models.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-/tmp/mlxbar-tiny}
mkdir -p "$DIR"
[ -x "$DIR/venv/bin/python" ] && "$DIR/venv/bin/python" -c 'import mlx_lm, gguf, tokenizers' 2>/dev/null || {
  python3 -m venv "$DIR/venv" && "$DIR/venv/bin/pip" install -q 'mlx-lm==0.32.2' 'mlx[cpu]==0.32.4' 'gguf==0.19.0'; }
"$DIR/venv/bin/python" "$ROOT/scripts/reference/make_tiny_models.py" "$ROOT/tests/data/tiny"
