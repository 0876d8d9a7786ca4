#!/usr/bin/env bash
# One-off: check the review commits, then the graph decode loop without and with MPS.
set -uo pipefail
pack=.device-pack-mps
source $pack/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $pack/wheels/*.whl
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== cuda_backend_test"; timeout 90 $pack/bin/cuda_backend_test 2>&1 | tail -4
for mps in "" --mps; do
  echo "=== graph loop $mps"
  timeout 230 python3 bench/decode_loop_bench.py --samplerd=$pack/bin/samplerd \
    --samplerctl=$pack/bin/samplerctl --steps=60 --graph --transports=channel,channel:0.0005,grpc $mps 2>&1 | tee -a $OUT/graph.txt
done
