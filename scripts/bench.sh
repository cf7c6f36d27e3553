#!/usr/bin/env bash
# Side-by-side benchmark: mlxbar (in process) against peer servers on the same machine and
# default model, measured in one run, interleaved. Peers come from ../shared/peers (or
# $PEERS_DIR): llama.cpp's own server (llama-server: 8 parallel slots, continuous batching,
# the anchor under load), llama-cpp-python's server (one request at a time), mlx_lm.server
# on the same MLX CPU build, vllm-mlx.
# Usage: scripts/bench.sh [PEER...]   PEER: llama-server | llama-cpp | mlx-lm | vllm-mlx
# (default: llama-server llama-cpp mlx-lm; llama-server and llama-cpp each build llama.cpp
# once, ~17 min on 2 cores)
# BENCH_ARGS picks the plan, e.g. BENCH_ARGS="--profile concurrency-sweep" (default: --profile quick).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS_DIR:-$ROOT/../shared/peers}
DIR=${PEERS_WORKDIR:-/tmp/mlxbar-peers}
WANT=${*:-llama-server llama-cpp mlx-lm}
[ -x "$PEERS/setup.sh" ] || [ -f "$PEERS/setup.sh" ] || { echo "peer scripts not found at $PEERS (set PEERS_DIR)" >&2; exit 1; }
# llama.cpp built for the native CPU segfaults on its first decode on AMX-capable Xeons
# (seen here): build it for AVX-512 without AMX instead.
if grep -q amx /proc/cpuinfo 2>/dev/null; then
  export CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON"}
fi
bash "$PEERS/setup.sh" "$DIR" $WANT
cd "$ROOT"
cargo build --release --bin mlxbar
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
args=()
port=8101
for peer in $WANT; do
  pids+=("$(bash "$PEERS/serve.sh" "$peer" "$port" "$DIR" | tail -1)")
  case $peer in
    mlx-lm) args+=(--compare "mlx_lm.server=http://127.0.0.1:$port#default_model");;
    llama-server) args+=(--compare "llama-server=http://127.0.0.1:$port#smollm2");;
    llama-cpp) args+=(--compare "llama-cpp-python=http://127.0.0.1:$port#smollm2");;
    vllm-mlx) args+=(--compare "vllm-mlx=http://127.0.0.1:$port#smollm2");;
  esac
  port=$((port + 1))
done
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
./target/release/mlxbar bench ${BENCH_ARGS:---profile quick} "${args[@]}"
