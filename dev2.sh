#!/usr/bin/env bash
# One-off device call: issue 50 on the fast paths (test, mutants, cost), then issue 46's graph loop.
set -uo pipefail
pack=.device-pack-mps
source $pack/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $pack/wheels/*.whl
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
echo "=== cuda_backend_test"; timeout 150 $pack/bin/cuda_backend_test > $OUT/cbt.txt 2>&1; echo "rc=$?"
grep -E "^\[  (FAILED|PASSED) |issue 50:|tests ran" $OUT/cbt.txt | head -20
grep -B3 -A12 "Failure" $OUT/cbt.txt | head -60
echo "t=$((SECONDS-t0))"
echo "=== mutants"; MUTANT_FILTER='*TopNSigma*:*RawLogprobsFail*' MUTANT_TARBALL=.device-pack/mutants.tar.xz timeout 150 bash scripts/mutate_gpu.sh 2>&1 | tail -6
echo "t=$((SECONDS-t0))"
echo "=== issue 50 cost"; timeout 100 $pack/bin/gpu_bench --only=issue50 2>&1 | tail -12
echo "t=$((SECONDS-t0))"
for mps in "" --mps; do
  echo "=== graph loop $mps"
  timeout 170 python3 bench/decode_loop_bench.py --samplerd=$pack/bin/samplerd \
    --samplerctl=$pack/bin/samplerctl --steps=40 --graph --transports=channel,channel:0.0005,grpc $mps 2>&1 | tee -a $OUT/graph.txt | grep -v "^\s*parts"
  echo "t=$((SECONDS-t0))"
done
