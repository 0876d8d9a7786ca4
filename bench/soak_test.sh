#!/usr/bin/env bash
# soak_test SOAK_BENCH SAMPLERD: a 5-second soak with --check (see soak_bench.cc).
set -euo pipefail
exec "$1" --samplerd="$2" --duration_s=5 --vocab=4096 --check
