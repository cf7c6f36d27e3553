#!/usr/bin/env bash
# Regenerates tests/data/tiny/gpt-oss-harmony (the tiny gpt-oss with harmony's special tokens
# and gpt-oss's chat template, tests/data/templates/gpt-oss.jinja) and
# tests/data/harmony_template_reference.json (that template rendered by transformers), with
# the venv of scripts/make-tiny-models.sh (mlx-lm pulls in transformers and tokenizers).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-/tmp/mlxbar-tiny}
PY="$DIR/venv/bin/python"
[ -x "$PY" ] || { echo "run scripts/make-tiny-models.sh first (it makes $DIR/venv)" >&2; exit 1; }
"$PY" "$ROOT/scripts/reference/make_harmony_fixture.py" "$ROOT/tests/data/tiny"
"$PY" "$ROOT/scripts/reference/make_harmony_template_reference.py" "$ROOT/tests/data/tiny/gpt-oss-harmony" \
  "$ROOT/tests/data/harmony_template_reference.json"
