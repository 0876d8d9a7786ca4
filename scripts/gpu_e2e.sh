#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu_check.sh packed .device-pack): samplerd with
# --backend=auto (CUDA there);
# GetServerInfo, the example step, the two workers with logits in GPU memory
# (tests/cuda_ipc_worker: cudaMalloc + IPC event; the Python client's test_cuda.py: a PyTorch
# tensor registered with register_cuda_tensor, per-step ReadyEvent; it starts its own two
# samplerds), and `samplerctl bench` with R = 16, V = 129,280: logits in a
# registered CUDA IPC region, a registered shm region and inline, unary and streaming.
set -uo pipefail
cd "$(dirname "$0")/.."
source .device-pack/env.sh
dir=$(mktemp -d)
start() {  # start NAME ARGS...: a samplerd whose address lands in $dir/NAME.addr
  local name=$1; shift
  .device-pack/bin/samplerd --listen=127.0.0.1:0 --port_file="$dir/$name.port" "$@" &
  for _ in $(seq 200); do [[ -s $dir/$name.port ]] && break; sleep 0.05; done
  echo "127.0.0.1:$(head -1 "$dir/$name.port")" > "$dir/$name.addr"
}
start gpu --log_level=info
gpu_pid=$!
target=$(cat "$dir/gpu.addr")
status=0
.device-pack/bin/samplerctl info --target="$target" | head -5
.device-pack/bin/samplerctl sample --target="$target" examples/prefill.json | grep -A2 tokenIds | head -6
.device-pack/bin/cuda_ipc_worker --target="$target" || { echo "cuda_ipc_worker FAILED"; status=1; }
pylib=$dir/pylib
python3 -m pip install -q --no-index --find-links=.device-pack/wheels --target="$pylib" --no-deps \
  samplerd pytest pluggy iniconfig packaging
# The whole client suite against the CUDA backend (xgrammar is not installed there: skipped).
PYTHONPATH=$pylib SAMPLERD_BIN=.device-pack/bin/samplerd SAMPLERD_TEST_BACKEND=cuda \
  python3 -m pytest -q -s -p no:cacheprovider client/python/tests \
  || { echo "client/python/tests FAILED"; status=1; }
for source in cuda_ipc shm; do
  for mode in unary stream; do
    .device-pack/bin/samplerctl bench --target="$target" --rows=16 --vocab=129280 --steps=500 \
      --source=$source --mode=$mode || status=1
  done
done
.device-pack/bin/samplerctl bench --target="$target" --rows=16 --vocab=129280 --steps=100 --source=inline --mode=stream
kill -TERM $gpu_pid; wait $gpu_pid; echo "samplerd exit $?"
exit $status
