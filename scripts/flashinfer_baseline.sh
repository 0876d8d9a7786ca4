#!/usr/bin/env bash
# Builds bench/flashinfer_baseline.cu against FlashInfer's headers from the flashinfer-python
# wheel on PyPI (downloaded into ~/.cache/samplerd, never copied into the repository), into
# $1 (default .device-pack/bin). scripts/gpu_check.sh calls it; `gpu_check.sh run` runs the
# binary beside gpu_bench, on the same logits, in the same call.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device-pack/bin}
version=0.7.4
cache=${SAMPLERD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/samplerd}/flashinfer-$version
if [[ ! -d $cache/flashinfer/data/include ]]; then
  mkdir -p "$cache"
  python3 -m pip download -q --no-deps "flashinfer-python==$version" -d "$cache"
  (cd "$cache" && python3 -m zipfile -e flashinfer_python-$version-py3-none-any.whl . >/dev/null)
fi
# fast_topk_clusters_exact.cuh includes TVM-FFI's error header (its checks): the headers of
# the apache-tvm-ffi wheel flashinfer-python 0.7.4 requires, from PyPI too.
tvm_ffi=$cache/apache-tvm-ffi
if [[ ! -f $tvm_ffi/tvm_ffi/include/tvm/ffi/error.h ]]; then
  mkdir -p "$tvm_ffi"
  python3 -m pip download -q --no-deps "apache-tvm-ffi==0.1.15.post2" --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$tvm_ffi"
  (cd "$tvm_ffi" && python3 -m zipfile -e apache_tvm_ffi-*.whl . >/dev/null)
fi
mkdir -p "$out"
/usr/local/cuda/bin/nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -I . -I "$cache/flashinfer/data/include" \
  -I "$tvm_ffi/tvm_ffi/include" \
  bench/flashinfer_baseline.cu -o "$out/flashinfer_baseline"
echo "flashinfer_baseline: built against flashinfer-python $version"
