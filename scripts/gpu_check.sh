#!/usr/bin/env bash
# Builds the GPU tests and benchmarks here and packs them for the GPU machine (device-pack),
# then xz's the pack into .device-pack.tar.xz: the directory is over a device call's 64 MiB
# carry, the archive ~21 MB (scripts/device_pack_open.sh unpacks it there).
# Then, on the GPU machine (one `device` call, carrying .device-pack.tar.xz):
#   bash scripts/gpu_check.sh run
# runs the gpu-tagged tests, the stress test against samplerd on CUDA, the FlashInfer baseline, the GPU benchmark (its table beside
# FlashInfer's figures and the read floor) and the PyTorch baseline.
# `run quick`: cuda_backend_test, then the baselines and benchmark only (kernel iterations).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == run ]]; then
  source scripts/device_pack_open.sh
  source .device-pack/env.sh
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  status=0
  .device-pack/bin/cuda_backend_test || status=$?
  .device-pack/bin/cuda_token_adjustments_test || status=$?
  [[ ${2:-} == quick ]] || .device-pack/bin/nccl_group_test || status=$?
  # Issue 25's stress test against samplerd --backend=cuda (scripts/gpu_stress.sh runs it
  # under compute-sanitizer).
  bash scripts/gpu_stress.sh plain || status=$?
  # FlashInfer on gpu_bench's logits (where scripts/flashinfer_baseline.sh could build it), then
  # gpu_bench, which prints its figures beside FlashInfer's and the read floor.
  bench_args=()
  if [[ -x .device-pack/bin/flashinfer_baseline ]]; then
    fi_out=$(mktemp)
    .device-pack/bin/flashinfer_baseline "$fi_out" || status=$?
    bench_args=(--flashinfer="$fi_out")
  fi
  .device-pack/bin/gpu_bench "${bench_args[@]}" || status=$?
  [[ ${2:-} == quick ]] || python3 bench/torch_baseline.py || status=$?
  exit $status
fi
bazel build -c opt //cuda:cuda_backend_test //cuda:cuda_token_adjustments_test \
  //cuda:nccl_group_test //bench:gpu_bench \
  //server:samplerd //client:samplerctl //tests:fake_worker //tests:cuda_ipc_worker \
  //tests:multi_gpu_group_test //tests:group_follower //bench:group_bench //tests:stress_test
grep -qx '/.device-pack/' .git/info/exclude 2>/dev/null || echo '/.device-pack/' >> .git/info/exclude
grep -qx '/.device-pack.tar.xz' .git/info/exclude 2>/dev/null || echo '/.device-pack.tar.xz' >> .git/info/exclude
rm -rf .device-pack
../shared/tools/device-pack .device-pack bazel-bin/cuda/cuda_backend_test \
  bazel-bin/cuda/cuda_token_adjustments_test bazel-bin/bench/gpu_bench \
  bazel-bin/server/samplerd bazel-bin/client/samplerctl bazel-bin/tests/fake_worker \
  bazel-bin/tests/cuda_ipc_worker bazel-bin/cuda/nccl_group_test \
  bazel-bin/tests/multi_gpu_group_test bazel-bin/tests/group_follower bazel-bin/bench/group_bench \
  bazel-bin/tests/stress_test
# The Python client as a wheel, and pytest (the GPU machine has torch, grpcio, protobuf and
# numpy, but no PyPI), for its CUDA tensor test (client/python/tests/test_cuda.py).
venv=$(bash scripts/pyvenv.sh client/python/tests/requirements.txt)
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps -w .device-pack/wheels ./client/python
"$venv/bin/pip" download -q --disable-pip-version-check --no-deps -d .device-pack/wheels \
  pytest pluggy iniconfig packaging
# The FlashInfer baseline (needs PyPI here; the GPU machine has none). Optional.
bash scripts/flashinfer_baseline.sh .device-pack/bin || echo "flashinfer_baseline: not built"
tar -cf - .device-pack | xz -T0 -6 > .device-pack.tar.xz
echo "packed: .device-pack.tar.xz ($(du -h .device-pack.tar.xz | cut -f1); carry it, not .device-pack)"
