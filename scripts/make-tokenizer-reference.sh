#!/usr/bin/env bash
# Regenerates tests/data/tokenizer_reference.json (llama.cpp's token ids for the default GGUF's
# tokenizer, for tests/tokenizer.rs; needs Python and a C++ compiler, the tests do not).
# Installs llama-cpp-python with ../shared/peers/setup.sh (the same build as
# scripts/make-llamacpp-reference.sh), then runs scripts/reference/make_tokenizer_reference.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS_DIR:-$ROOT/../shared/peers}
DIR=${1:-/tmp/mlxbar-peers}
export CMAKE_ARGS=${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}
bash "$PEERS/setup.sh" "$DIR" llama-cpp
"$DIR/venv-llama/bin/python" "$ROOT/scripts/reference/make_tokenizer_reference.py" "$DIR/model.gguf" \
  "$ROOT/tests/data/reference.json" "$ROOT/tests/data/tokenizer_reference.json"
