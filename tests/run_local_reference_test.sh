#!/usr/bin/env bash
# Runs the NumPy reference check of samplerctl run-local with Debian's python3 (which has
# python3-numpy; scripts/install-deps.sh installs both).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/run_local_reference_test.py" "$1"
