#!/usr/bin/env bash
# Install promtool, Prometheus's rule checker, for the alert-rule tests
# (tests/loadgen/monitoring/test_export_monitoring.py): the one binary from Debian's `prometheus` package, into
# /usr/local/bin (on PATH). The package itself is not installed: its server, service user and web assets are not
# needed. Idempotent: does nothing when `promtool` is already on PATH. Uses sudo only when not root.
set -euo pipefail

command -v promtool >/dev/null 2>&1 && { echo "promtool already installed: $(command -v promtool)"; exit 0; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"  # not root: sudo, or its own error where it is missing

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chmod a+rwx "$work"  # apt's download user (_apt) writes the package there

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
(cd "$work" && apt-get download -q prometheus)
dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -x -C "$work" ./usr/bin/promtool
$SUDO install -m 0755 "$work/usr/bin/promtool" /usr/local/bin/promtool
command -v promtool >/dev/null 2>&1 || { echo "error: promtool not on PATH after install" >&2; exit 1; }
echo "installed: $(promtool --version 2>&1 | head -n 1)"
