#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu_check.sh packed .device-pack): where one kernel of one
# gpu_bench configuration spends its instructions and its warps' stalls, per SASS instruction.
# Profiles the 6th launch of KERNEL (a regex) in `gpu_bench --only=CONFIG` with ncu (clocks
# not locked) and writes, under OUT_DIR:
#   report.ncu-rep   the whole report (open it with ncu-ui or `ncu -i`)
#   summary.txt      SpeedOfLight, WarpStateStats, InstructionStats, Occupancy
#   source.csv       per SASS instruction: executed count, stall samples, CUDA source line
#
#   bash scripts/gpu_ncu_source.sh KERNEL CONFIG OUT_DIR
# (PACK=.device-pack-mps: the binaries of scripts/gpu_mps.sh's pack instead.)
# e.g. bash scripts/gpu_ncu_source.sh SplitRowKernel "decode R=384 (64x6)" "$OUT/decode384"
set -euo pipefail
cd "$(dirname "$0")/.."
pack=${PACK:-.device-pack}
[[ $pack != .device-pack ]] || source scripts/device_pack_open.sh  # PACK names another pack
source $pack/env.sh
kernel=$1
config=$2
out=$3
mkdir -p "$out"
ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section InstructionStats \
  --section Occupancy --section SourceCounters --import-source yes \
  -f -o "$out/report" $pack/bin/gpu_bench --only="$config" > "$out/run.log" 2>&1
ncu -i "$out/report.ncu-rep" --print-summary none > "$out/summary.txt" 2>&1
ncu -i "$out/report.ncu-rep" --page source --csv --print-source cuda,sass \
  > "$out/source.csv" 2>"$out/source.err" ||
  ncu -i "$out/report.ncu-rep" --page source --csv --print-source sass > "$out/source.csv" 2>>"$out/source.err"
wc -l "$out/source.csv"
head -c 2000 "$out/summary.txt"
