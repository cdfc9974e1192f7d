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
elif "$py" -m pip install -q --no-index "torch==$version" 2>/dev/null; then
    # A local wheel (pip's find-links) satisfied it without touching an index.
    echo "install-torch: no GPU, installed torch==$version from a local CPU wheel"
else
    echo "install-torch: no GPU, installing torch==$version from the PyTorch CPU index"
    "$py" -m pip install -q "torch==$version" --index-url https://download.pytorch.org/whl/cpu
fi
