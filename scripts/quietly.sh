#!/usr/bin/env bash
# Run one setup command (a pip install) quietly: its output goes to LOG, nothing to the terminal.
#   scripts/quietly.sh LOG COMMAND [ARG...]
# On failure the command's whole output is printed to stderr (pip's error in full, with what it was
# resolving) and its exit status is returned. On success only the warnings that matter are printed,
# one line each; those listed in HARMLESS below are kept in LOG alone.
set -uo pipefail
log=$1
shift

# Warnings that say nothing about this project:
# - "Location 'file:///...' is ignored": this machine's pip configuration names an extra local index
#   that does not hold every package; pip falls back to the others, as intended.
# - "Editable installation." and its follow-up lines: setuptools' note (InformationOnly) that an
#   editable install imports from the working tree, which is the point of one.
HARMLESS="Location 'file://[^']*' is ignored|BuildBackendWarning: Editable installation\."

mkdir -p "$(dirname "$log")"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
{ echo "\$ $*"; cat "$out"; echo "(exit $rc)"; } >>"$log"
if [ "$rc" -ne 0 ]; then
    echo "setup: FAILED (exit $rc): $*" >&2
    cat "$out" >&2
    echo "setup: the same output, with the earlier steps', is in $log" >&2
    exit "$rc"
fi
grep -E "^(WARNING|DEPRECATION):|Warning: " "$out" | grep -Ev "$HARMLESS" | sed 's/^ *//; s/^WARNING: //' | awk '!seen[$0]++' \
    | sed 's/^/setup: warning: /' >&2
exit 0
