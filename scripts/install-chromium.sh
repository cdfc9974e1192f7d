#!/usr/bin/env bash
# Install headless Chromium from Debian's packages, for the report tests (tests/loadgen/report/test_report_browser.py).
# Idempotent: does nothing when `chromium` is already on PATH. Uses sudo only when not root.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v chromium)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "error: not root and sudo is not available; install the Debian package 'chromium' by hand" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium
command -v chromium >/dev/null 2>&1 || { echo "error: chromium not on PATH after install" >&2; exit 1; }
echo "installed: $(chromium --version 2>/dev/null || command -v chromium)"
