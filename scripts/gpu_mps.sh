#!/usr/bin/env bash
# Issue 46 on the GPU machine: samplerd and PyTorch workers as clients of one MPS server.
# Here: `bash scripts/gpu_mps.sh` builds samplerd (CUDA) and packs it with the Python client
# into .device-pack-mps. There (one `device` call, carrying .device-pack-mps):
#   bash scripts/gpu_mps.sh run
# runs the CUDA client tests (test_cuda.py: a worker's tensor with a ready event, CPU == CUDA;
# test_cuda_dead_worker.py: 20 workers SIGKILLed) without MPS, then under a private MPS control
# daemon (started for the call and always stopped: the card's settings are not touched):
# `samplerd --probe_gpu_context` must say MPS client, bench/mps_wedge.py kills workers while
# their kernels run (samplerd must exit 3 and every replacement get a context and sample), and
# the same client tests again (test_cuda_output.py too: tokens written into the worker's memory,
# the asynchronous loop; test_cuda_drafts.py: a drafter's distributions read in place). Exits
# non-zero if any of it failed.
#   bash scripts/gpu_mps.sh bench [STEPS]   (default 100)
# runs bench/decode_loop_bench.py and bench/hf_example_gpu.py without and with MPS.
#   bash scripts/gpu_mps.sh graphbench [STEPS]
# runs bench/decode_loop_bench.py with the model as one CUDA graph a step, without and with MPS,
# then gpu_bench's issue 50 cost figures.
#   bash scripts/gpu_mps.sh stress [SCENARIOS] [SECONDS]
# runs the stress test against samplerd on CUDA (every answer checked against the CPU backend).
#   bash scripts/gpu_mps.sh check
# runs all of cuda_backend_test, compute-sanitizer (memcheck, racecheck) over the StepOutput,
# device-draft, device-shard and two- and seven-chunk streaming-kernel tests, and the C++ StepOutput checks with the device's write
# (and with the host's: --cuda_device_step_output=false), without MPS.
set -uo pipefail
cd "$(dirname "$0")/.."
pack=.device-pack-mps
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/samplerd-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/samplerd-mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "gpu_mps: the MPS control daemon did not start"; exit 1; }
  trap 'echo quit | nvidia-cuda-mps-control; sleep 1' EXIT
}
client_tests=(client/python/tests/test_cuda.py client/python/tests/test_cuda_output.py
              client/python/tests/test_cuda_drafts.py client/python/tests/test_cuda_shards.py
              client/python/tests/test_cuda_dead_worker.py)
if [[ ${1:-} == run || ${1:-} == bench || ${1:-} == graphbench || ${1:-} == check ||
      ${1:-} == stress ]]; then
  source $pack/env.sh
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $pack/wheels/*.whl || exit 1
  export PYTHONPATH=/tmp/site SAMPLERD_BIN=$PWD/$pack/bin/samplerd SAMPLERD_TEST_BACKEND=cuda
fi
if [[ ${1:-} == bench ]]; then
  # The decode loop and the transformers example, without MPS then with a private daemon each.
  status=0
  # Four runs within one device call's 600 s.
  for mps in "" --mps; do
    timeout 140 python3 bench/decode_loop_bench.py --samplerd=$pack/bin/samplerd \
      --samplerctl=$pack/bin/samplerctl --steps="${2:-100}" $mps || status=1
  done
  for mps in "" --mps; do
    timeout 140 python3 bench/hf_example_gpu.py --samplerd=$pack/bin/samplerd --repeats=2 \
      --new_tokens=64 $mps || status=1
  done
  exit $status
fi
if [[ ${1:-} == graphbench ]]; then
  status=0
  for mps in "" --mps; do
    timeout 200 python3 bench/decode_loop_bench.py --samplerd=$pack/bin/samplerd \
      --samplerctl=$pack/bin/samplerctl --steps="${2:-60}" --graph $mps || status=1
  done
  timeout 120 stdbuf -oL $pack/bin/gpu_bench --only=issue50 || status=1
  exit $status
fi
# The C++ side of StepOutput: the backend's writes, then samplerctl bench --device_tokens (a
# stream waits on the done word; every step's device tokens checked against its response).
# `cpp_outputs --cuda_device_step_output=false` has samplerd write the tokens from the host.
cpp_outputs() {
  $pack/bin/cuda_backend_test --gtest_filter='*StepOutput*' || return 1
  local dir
  dir=$(mktemp -d)
  $pack/bin/samplerd --backend=cuda --listen=127.0.0.1:0 --port_file="$dir/port" "$@" \
    > "$dir/log" 2>&1 &
  local pid=$! rc=0
  for _ in $(seq 100); do [[ -s $dir/port ]] && break; sleep 0.1; done
  for mode in stream channel; do
    $pack/bin/samplerctl bench --target="127.0.0.1:$(head -1 "$dir/port")" --rows=64 \
      --vocab=128256 --source=cuda_ipc --device_tokens --mode=$mode --steps=300 || rc=1
  done
  kill $pid; wait $pid
  return $rc
}
if [[ ${1:-} == stress ]]; then
  # Issue 25's stress test against samplerd --backend=cuda, from this pack.
  PACK=$pack exec timeout "${3:-240}" bash scripts/gpu_stress.sh plain "${2:-100}"
fi
if [[ ${1:-} == check ]]; then
  status=0
  timeout 240 $pack/bin/cuda_backend_test || status=1
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $pack/bin/cuda_backend_test \
      --gtest_filter='*StepOutput*:*DeviceDrafts*:*DeviceShards*:*SplitStreamKernelEqualsTheChunkBlocksOn*' > /tmp/sanitizer.txt 2>&1 || status=1
    tail -n 4 /tmp/sanitizer.txt
  done
  cpp_outputs || status=1
  cpp_outputs --cuda_device_step_output=false || status=1
  exit $status
fi
if [[ ${1:-} == run ]]; then
  status=0
  echo "=== without MPS"
  $pack/bin/samplerd --probe_gpu_context || status=1
  cpp_outputs || status=1
  python3 -m pytest -q -s -p no:cacheprovider "${client_tests[@]}" || status=1
  mps_start
  echo "=== under MPS"
  $pack/bin/samplerd --probe_gpu_context | tee /tmp/probe.txt || status=1
  grep -q "MPS client" /tmp/probe.txt || { echo "gpu_mps: not an MPS client under MPS"; status=1; }
  # Workers killed mid-kernel: samplerd must exit (3) so the MPS server serves the next ones.
  timeout 240 python3 bench/mps_wedge.py $pack/bin/samplerd "${2:-15}" || status=1
  python3 -m pytest -q -s -p no:cacheprovider "${client_tests[@]}" || status=1
  cpp_outputs || status=1
  echo "=== after the tests: a new context still comes"
  $pack/bin/samplerd --probe_gpu_context || status=1
  tail -n 20 "$CUDA_MPS_LOG_DIRECTORY"/server.log 2>/dev/null
  exit $status
fi
bazel build -c opt //server:samplerd //client:samplerctl //cuda:cuda_backend_test \
  //bench:gpu_bench //tests:stress_test || exit 1
grep -qx "/$pack/" .git/info/exclude 2>/dev/null || echo "/$pack/" >> .git/info/exclude
rm -rf $pack
../shared/tools/device-pack $pack bazel-bin/server/samplerd bazel-bin/client/samplerctl \
  bazel-bin/cuda/cuda_backend_test bazel-bin/bench/gpu_bench bazel-bin/tests/stress_test || exit 1
venv=$(bash scripts/pyvenv.sh client/python/tests/requirements.txt)
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps -w $pack/wheels ./client/python
"$venv/bin/pip" download -q --disable-pip-version-check --no-deps -d $pack/wheels \
  pytest pluggy iniconfig packaging
du -sh $pack
