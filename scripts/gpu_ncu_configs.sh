#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu_check.sh packed .device-pack): ncu's reading of the split
# path's kernel in each fp32 gpu_bench configuration (clocks not locked; the 6th launch of each:
# the chunk blocks' SplitRowKernel at R < 256, the streaming SplitStreamKernel from there), the
# evidence behind the kernels' speed figures. Writes OUT_DIR/ncu_<n>.txt per configuration and
# prints the lines that matter: duration, SM and DRAM throughput, issue rate, occupancy.
#
#   bash scripts/gpu_ncu_configs.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_pack_open.sh
source .device-pack/env.sh
out=$1
mkdir -p "$out"
n=0
for config in "prefill R=1" "prefill R=16" "prefill R=384" "decode R=384 (64x6)" "prompt R=8192"; do
  n=$((n + 1))
  ncu --clock-control none --kernel-name 'regex:Split(Row|Stream)Kernel' --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section InstructionStats \
    --section LaunchStats --section ComputeWorkloadAnalysis \
    .device-pack/bin/gpu_bench --only="$config" > "$out/ncu_$n.txt" 2>&1
  echo "== $config"
  grep -E "^\s+(void|Duration|Compute \(SM\) Throughput|DRAM Throughput|Warp Cycles Per Issued|Issue Slots Busy|Issued Ipc Active|Achieved Occupancy|Theoretical Occupancy|Executed Instructions  |Registers Per Thread|Waves Per SM|Grid Size) " "$out/ncu_$n.txt"
done
