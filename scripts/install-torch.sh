#!/usr/bin/env bash
# Install the right torch build into the given Python before the project itself.
#   scripts/install-torch.sh [PYTHON] [LOG]
# Without a GPU we want the CPU wheel: a bare `torch` requirement pulls a multi-GB CUDA build.
# With a GPU (nvidia-smi works) we keep the default CUDA build from PyPI.
# Prints one line saying which build it installs; pip's output goes to LOG (default: a temporary file)
# and is printed only when pip fails (scripts/quietly.sh).
set -euo pipefail
py=${1:-python3}
version=${TORCH_VERSION:-2.13.0}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=${2:-$tmp/pip.log}
pip_install() { "$here/quietly.sh" "$log" "$py" -m pip install "$@"; }

if "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$version' else 1)" 2>/dev/null; then
    echo "setup: torch==$version is installed already"
    exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: installing torch==$version (CUDA build: a GPU is present)"
    pip_install "torch==$version"
    exit 0
fi
# A CPU wheel already on this machine (pip's find-links)? Install that very file; its dependencies come
# from the usual index.
if "$py" -m pip download -q --no-deps --no-index "torch==$version" -d "$tmp/wheel" >/dev/null 2>&1 \
        && ls "$tmp"/wheel/torch-*+cpu-*.whl >/dev/null 2>&1; then
    wheel=$(ls "$tmp"/wheel/torch-*+cpu-*.whl)
    echo "setup: installing torch==$version (CPU wheel on this machine: $(basename "$wheel"))"
    pip_install "$wheel"
else
    echo "setup: installing torch==$version (CPU wheel from the PyTorch CPU index)"
    pip_install "torch==$version" --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple
fi
