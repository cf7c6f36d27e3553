#!/usr/bin/env bash
# Regenerates tests/data/reference.json (needs Python; the tests themselves do not).
# Installs mlx-lm and converts the default GGUF with ../shared/peers, then runs
# scripts/reference/make_reference.py there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS_DIR:-$ROOT/../shared/peers}
DIR=${1:-/tmp/mlxbar-peers}
bash "$PEERS/setup.sh" "$DIR" mlx-lm
"$DIR/venv-mlx/bin/python" "$ROOT/scripts/reference/make_reference.py" "$DIR/smollm2-mlx" "$ROOT/tests/data/reference.json"
