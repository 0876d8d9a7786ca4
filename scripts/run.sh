#!/usr/bin/env bash
# The main job: builds samplerd and starts it on its embedded default (CPU backend,
# 127.0.0.1:50051), in the foreground; Ctrl-C (SIGINT) or SIGTERM drains and stops it.
# Installs what it needs first. Extra arguments go to samplerd (see `samplerd --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bazel build -c opt //server:samplerd //client:samplerctl >&2
exec ./bazel-bin/server/samplerd "$@"
