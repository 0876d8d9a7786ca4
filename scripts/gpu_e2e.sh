#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu_check.sh packed .device-pack): samplerd with
# --backend=auto (CUDA there), GetServerInfo, the example step, and `samplerctl bench` with
# R = 16, V = 129,280, logits in a registered shm region, unary and streaming.
set -uo pipefail
cd "$(dirname "$0")/.."
source .device-pack/env.sh
dir=$(mktemp -d)
.device-pack/bin/samplerd --listen=127.0.0.1:0 --port_file="$dir/port" --log_level=info &
pid=$!
for _ in $(seq 200); do [[ -s $dir/port ]] && break; sleep 0.05; done
target=127.0.0.1:$(head -1 "$dir/port")
.device-pack/bin/samplerctl info --target="$target" | head -5
.device-pack/bin/samplerctl sample --target="$target" examples/prefill.json | grep -A2 tokenIds | head -6
for mode in unary stream; do
  .device-pack/bin/samplerctl bench --target="$target" --rows=16 --vocab=129280 --steps=200 --source=shm --mode=$mode
done
.device-pack/bin/samplerctl bench --target="$target" --rows=16 --vocab=129280 --steps=100 --source=inline --mode=stream
.device-pack/bin/cuda_ipc_worker --target="$target" || echo "cuda_ipc_worker FAILED"
kill -TERM $pid; wait $pid; echo "samplerd exit $?"
