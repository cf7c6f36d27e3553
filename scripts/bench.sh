#!/usr/bin/env bash
# Side-by-side benchmark: mlxbar (in process) against peer servers on the same machine and
# default model, measured in one run, interleaved. Peers come from ../shared/peers (or
# $PEERS_DIR): llama.cpp's own server (llama-server: 8 parallel slots, continuous batching,
# the anchor under load), llama-cpp-python's server (one request at a time), mlx_lm.server
# on the same MLX CPU build, vllm-mlx.
# Usage: scripts/bench.sh [PEER...]   PEER: llama-server | llama-server-lookup | llama-cpp | mlx-lm | vllm-mlx
# (default: llama-server llama-cpp mlx-lm; llama-server and llama-cpp each build llama.cpp
# once, ~17 min on 2 cores)
# llama-server-lookup is a second llama-server drafting by n-gram lookup in its own context
# (LOOKUP_ARGS, below): the peer for the edit profile, where the answer copies the prompt's
# file. None of the peers takes Predicted Outputs' `prediction`; they ignore it, and their
# rows say "sent, not counted".
# BENCH_ARGS picks the plan, e.g. BENCH_ARGS="--profile concurrency-sweep" (default: --profile quick);
# the edit profile against both llama-servers:
#   BENCH_ARGS="--profile edit" scripts/bench.sh llama-server llama-server-lookup
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
# n-gram lookup types tried by hand on the edit request (the edit profile's, non-streamed,
# 450 tokens, temperature 0; default sizes; decode tok/s as llama-server timed it, 4 requests
# each, on "AMD EPYC" (lscpu), 2 vCPU, machine otherwise idle): none 97/91/90/90;
# ngram-simple 79/73/111/75; ngram-map-k 82/68/106/85; ngram-map-k4v 84/68/107/85;
# ngram-mod 92/79/100/130; ngram-cache 106/105/105/93 (e2e 5.9 s against 6.6 s without).
# SmolLM2-135M copies the file loosely (25-60% of drafted tokens accepted), so the gain is
# small; ngram-cache was the steadiest and fastest.
LOOKUP_ARGS=${LOOKUP_ARGS:-"--spec-type ngram-cache"}
# llama-server-lookup is llama-server's build, started here with LOOKUP_ARGS (serve.sh has no flags).
SETUP=$(for p in $WANT; do [ "$p" = llama-server-lookup ] && echo llama-server || echo "$p"; done | sort -u)
# shellcheck disable=SC2086  # SETUP is a list of names
bash "$PEERS/setup.sh" "$DIR" $SETUP
serve_lookup() {  # PORT: serve.sh's llama-server line plus LOOKUP_ARGS; prints the PID
  mkdir -p "$DIR/logs"
  # shellcheck disable=SC2086  # LOOKUP_ARGS is a list of flags
  # Runs inside $(...): the cd stays in that subshell, and only the server goes to the
  # background (a backgrounded `cd && server` would hold the substitution's pipe open).
  cd "$DIR" || exit 1
  LD_LIBRARY_PATH=$DIR/llama-server setsid llama-server/llama-server --model model.gguf --host 127.0.0.1 --port "$1" \
    --parallel 8 --ctx-size 16384 --cont-batching --threads "$(nproc)" --metrics $LOOKUP_ARGS >logs/llama-server-lookup.log 2>&1 </dev/null &
  echo $!
}
cd "$ROOT"
cargo build --release --bin mlxbar
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
args=()
port=8101
for peer in $WANT; do
  if [ "$peer" = llama-server-lookup ]; then
    pids+=("$(serve_lookup "$port")")
    for i in $(seq 1 120); do
      curl -fsS -m 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"model":"smollm2","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' >/dev/null 2>&1 && break
      kill -0 "${pids[-1]}" 2>/dev/null && [ "$i" -lt 120 ] || { echo "llama-server-lookup not ready; see $DIR/logs/llama-server-lookup.log" >&2; exit 1; }
      sleep 1
    done
  else
    pids+=("$(bash "$PEERS/serve.sh" "$peer" "$port" "$DIR" | tail -1)")
  fi
  case $peer in
    mlx-lm) args+=(--compare "mlx_lm.server=http://127.0.0.1:$port#default_model");;
    llama-server) args+=(--compare "llama-server=http://127.0.0.1:$port#smollm2");;
    llama-server-lookup) args+=(--compare "llama-server-lookup=http://127.0.0.1:$port#smollm2");;
    llama-cpp) args+=(--compare "llama-cpp-python=http://127.0.0.1:$port#smollm2");;
    vllm-mlx) args+=(--compare "vllm-mlx=http://127.0.0.1:$port#smollm2");;
  esac
  port=$((port + 1))
done
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
./target/release/mlxbar bench ${BENCH_ARGS:---profile quick} "${args[@]}"
