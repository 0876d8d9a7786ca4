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
# FlashInfer's cluster sampler (csrc/cake_sampling): the binding FlashInfer's JIT would render,
# compiled once into an object (its generated kernels are one 53 MB translation unit: tens of
# minutes of nvcc on two cores), and the launch plans its Python dispatcher picks on an H200.
fi_root=$cache/flashinfer
gen=$cache/cake-build
mkdir -p "$gen"
python3 bench/flashinfer_cake.py binding "$fi_root" > "$gen/binding.cu.new"
python3 bench/flashinfer_cake.py plans "$fi_root" 129280 50 1,16,384,8192 > "$gen/cake_plans.h"
nvcc=/usr/local/cuda/bin/nvcc
if [[ ! -f $gen/cake.o ]] || ! cmp -s "$gen/binding.cu.new" "$gen/binding.cu"; then
  mv "$gen/binding.cu.new" "$gen/binding.cu"
  rm -f "$gen/cake.o"
  echo "flashinfer_baseline: compiling FlashInfer's cake_sampling kernels (once; slow)"
  # FlashInfer's JIT flags for this module (flashinfer/jit/core.py, cpp_ext.py) on sm_90a.
  (cd "$gen" && $nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a \
    --expt-relaxed-constexpr --compiler-options=-fPIC -static-global-template-stub=false \
    -DNDEBUG -DFLASHINFER_ENABLE_F16 -DFLASHINFER_ENABLE_BF16 -Xfatbin=-compress-all -w \
    -I "$fi_root/data/csrc/cake_sampling" -I "$fi_root/data/csrc" -I "$fi_root/data/include" \
    -I "$tvm_ffi/tvm_ffi/include" -c binding.cu -o cake.o.tmp && mv cake.o.tmp cake.o)
else
  rm -f "$gen/binding.cu.new"
fi
mkdir -p "$out"
cp "$tvm_ffi/tvm_ffi/lib/libtvm_ffi.so" "$out/"
# Compressed device code: the GPU machine takes 64 MiB of binaries a call.
$nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xfatbin=-compress-all \
  --expt-relaxed-constexpr -I . -I "$fi_root/data/include" -I "$tvm_ffi/tvm_ffi/include" \
  -I "$gen" bench/flashinfer_baseline.cu "$gen/cake.o" -L "$out" -ltvm_ffi \
  -Xlinker -rpath -Xlinker '$ORIGIN' -o "$out/flashinfer_baseline"
echo "flashinfer_baseline: built against flashinfer-python $version"
