#!/usr/bin/env bash
# Install the right torch build into the given Python before the project itself.
# Without a GPU we want the CPU wheel: a bare `torch` requirement pulls a multi-GB CUDA build.
# With a GPU (nvidia-smi works) we keep the default CUDA build from PyPI.
set -euo pipefail
py=${1:-python3}
version=${TORCH_VERSION:-2.13.0}

if "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$version' else 1)" 2>/dev/null; then
    exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "install-torch: GPU found, installing torch==$version (CUDA build)"
    "$py" -m pip install -q "torch==$version"
    exit 0
fi
# A CPU wheel already on this machine (pip's find-links)? Install that very file; its dependencies come
# from the usual index.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if "$py" -m pip download -q --no-deps --no-index "torch==$version" -d "$tmp" >/dev/null 2>&1 \
        && ls "$tmp"/torch-*+cpu-*.whl >/dev/null 2>&1; then
    echo "install-torch: no GPU, installing the local CPU wheel $(basename "$tmp"/torch-*.whl)"
    "$py" -m pip install -q "$tmp"/torch-*+cpu-*.whl
else
    echo "install-torch: no GPU, installing torch==$version from the PyTorch CPU index"
    "$py" -m pip install -q "torch==$version" --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple
fi
