#!/usr/bin/env bash
# soak_test SOAK_BENCH SAMPLERD: a 5-second soak with --check (see soak_bench.cc). Under a
# sanitizer (--config=asan/tsan set SAMPLERD_SANITIZER) RSS grows by design (ASan's quarantine
# holds freed memory), so only the other invariants are checked there.
set -euo pipefail
growth=64
if [[ -n ${SAMPLERD_SANITIZER:-} ]]; then growth=-1; fi
exec "$1" --samplerd="$2" --duration_s=5 --vocab=4096 --check --max_rss_growth_mib=$growth
