#!/usr/bin/env bash
# The two-GPU run of context-parallel groups (nvidia-h200-x2). Here: `bash scripts/gpu_check.sh`
# packs everything (.device-pack, and .device-pack.tar.xz). Then one `device` call with kind
# nvidia-h200-x2, carrying .device-pack.tar.xz:
#   bash scripts/gpu_multi.sh
# runs tests/multi_gpu_group_test (samplerd rank 0 on GPU 0, the group_follower process rank 1
# on GPU 1: 1000 steps whose broadcasts equal the gRPC answers bitwise; NCCL logits from the
# follower; kill -9 of the follower mid-step; destroy and re-create), bench/group_bench
# (broadcast cost per step at R = 16 and 384, latency with and without a group), and the
# Python CP=2 example (examples/cp_decode_loop.py), then a TP = 2 logits shard on the second
# GPU (client/python/tests/test_cuda_shards.py -k peer). NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
# as the device notes ask).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_pack_open.sh
source .device-pack/env.sh
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
status=0
.device-pack/bin/multi_gpu_group_test .device-pack/bin/samplerd .device-pack/bin/group_follower \
  || status=1
.device-pack/bin/group_bench .device-pack/bin/samplerd .device-pack/bin/group_follower --steps=300 \
  || status=1
dir=$(mktemp -d)
.device-pack/bin/samplerd --listen=127.0.0.1:0 --port_file="$dir/port" --backend=cuda \
  --log_level=warn &
pid=$!
for _ in $(seq 200); do [[ -s $dir/port ]] && break; sleep 0.05; done
python3 -m pip install -q --no-index --find-links=.device-pack/wheels --target="$dir/pylib" \
  --no-deps samplerd
PYTHONPATH=$dir/pylib python3 examples/cp_decode_loop.py "127.0.0.1:$(head -1 "$dir/port")" \
  || status=1
kill -TERM $pid; wait $pid
# Issue 47: a tensor-parallel rank's logits shard on GPU 1, read by samplerd on GPU 0 by peer
# access (or refused naming the field where the GPUs have none).
python3 -m pip install -q --no-index --find-links=.device-pack/wheels --target="$dir/pylib" \
  --no-deps pytest pluggy iniconfig packaging
SAMPLERD_BIN=$PWD/.device-pack/bin/samplerd SAMPLERD_TEST_BACKEND=cuda PYTHONPATH=$dir/pylib \
  python3 -m pytest -q -s -p no:cacheprovider client/python/tests/test_cuda_shards.py -k peer \
  || status=1
exit $status
