#!/usr/bin/env bash
# The main job: builds samplerctl and runs the bundled example step through the CPU backend,
# printing the SampleResponse JSON. Installs what it needs first.
#   bash scripts/run.sh [FILE]     (default: examples/prefill.json)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bazel build -c opt //client:samplerctl >&2
exec ./bazel-bin/client/samplerctl run-local "${1:-examples/prefill.json}"
