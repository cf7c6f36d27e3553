#!/usr/bin/env bash
# Regenerates tests/data/reference_llamacpp.json (llama.cpp's logits on the default GGUF, for
# tests/reference.rs; needs Python and a C++ compiler, the tests themselves do not).
# Installs llama-cpp-python with ../shared/peers/setup.sh (built from source; on this Xeon
# with AVX-512/AMX the default native build dies with SIGILL at its first eval, so
# CMAKE_ARGS below builds for AVX2/FMA/F16C instead: that build made the stored reference),
# then runs scripts/reference/make_llamacpp_reference.py on the prompts of reference.json.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS_DIR:-$ROOT/../shared/peers}
DIR=${1:-/tmp/mlxbar-peers}
export CMAKE_ARGS=${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}
bash "$PEERS/setup.sh" "$DIR" llama-cpp
"$DIR/venv-llama/bin/python" "$ROOT/scripts/reference/make_llamacpp_reference.py" "$DIR/model.gguf" \
  "$ROOT/tests/data/reference.json" "$ROOT/tests/data/reference_llamacpp.json"
