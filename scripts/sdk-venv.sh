#!/usr/bin/env bash
# The official client SDKs the tests drive the server with, in a venv of their own
# (~/.cache/mlxbar/sdk-venv, or $MLXBAR_SDK_VENV). Idempotent; prints the venv's python.
set -euo pipefail
VENV=${MLXBAR_SDK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mlxbar/sdk-venv}
PINS="openai==3.51.0 anthropic==2.16.0 ollama==0.6.3 pydantic==2.14.3 jsonschema==4.26.0"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.pins" 2>/dev/null)" != "$PINS" ]; then
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check $PINS >&2
  echo "$PINS" > "$VENV/.pins"
fi
echo "$VENV/bin/python"
