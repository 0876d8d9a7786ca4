#!/usr/bin/env bash
# End-to-end service benchmark: starts samplerd (CPU backend) on a free loopback port and runs
# `samplerctl bench` with R = 16, V = 129,280: logits inline vs in a registered shm region,
# 1 and 8 streams, unary vs streaming. Prints one line per configuration.
#   bash bench/service_bench.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-100}
bazel build -c opt //server:samplerd //client:samplerctl >&2
dir=$(mktemp -d)
./bazel-bin/server/samplerd --listen=127.0.0.1:0 --port_file="$dir/port" --log_level=warn \
  --max_queued_steps=256 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [[ -s $dir/port ]] && break; sleep 0.05; done
port=$(head -1 "$dir/port")
echo "samplerd on 127.0.0.1:$port ($(nproc) cores); R=16 V=129280 fp32 T=0.7 top_p=0.95 top_k=50 top-5"
for streams in 1 8; do
  for source in inline shm; do
    for mode in unary stream; do
      ./bazel-bin/client/samplerctl bench --target="127.0.0.1:$port" --streams=$streams \
        --rows=16 --vocab=129280 --steps=$steps --source=$source --mode=$mode
    done
  done
done
