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
source scripts/device_pack_open.sh
source .device-pack/env.sh
dir=$(mktemp -d)
start() {  # start NAME ARGS...: a samplerd whose address lands in $dir/NAME.addr
  local name=$1; shift
  .device-pack/bin/samplerd --listen=127.0.0.1:0 --port_file="$dir/$name.port" "$@" &
  for _ in $(seq 200); do [[ -s $dir/$name.port ]] && break; sleep 0.05; done
  echo "127.0.0.1:$(head -1 "$dir/$name.port")" > "$dir/$name.addr"
}
start gpu --log_level=info ${SAMPLERD_ARGS:-}
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
# Issue 15's table: per configuration the client's latency percentiles and steps/s, the
# server's compute split into kernels and the host work around them, and the empty-gRPC floor
# measured on the same channel in the same run.
bench() { .device-pack/bin/samplerctl bench --target="$target" --rows=16 --vocab=129280 "$@" || status=1; }
for mode in unary stream; do bench --steps=1000 --source=cuda_ipc --mode=$mode; done
for streams in 4 16; do bench --steps=1000 --source=cuda_ipc --mode=stream --streams=$streams; done
for mode in unary stream; do bench --steps=300 --source=shm --mode=$mode; done
bench --steps=300 --source=shm --mode=stream --streams=4
bench --steps=100 --source=inline --mode=stream
# The baseline of the concurrency figure, in the same run: the same 16 streams on a samplerd
# with one CUDA stream (steps one at a time on the device, as before lanes).
start serial --cuda_streams=1
serial_pid=$!
target=$(cat "$dir/serial.addr")
echo -n "[--cuda_streams=1] "; bench --steps=1000 --source=cuda_ipc --mode=stream --streams=16
kill -TERM $serial_pid; wait $serial_pid
target=$(cat "$dir/gpu.addr")
kill -TERM $gpu_pid; wait $gpu_pid; echo "samplerd exit $?"
exit $status
