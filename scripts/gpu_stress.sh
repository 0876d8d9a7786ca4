#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu_check.sh packed .device-pack): issue 25's stress test
# (tests/stress_test) against samplerd --backend=cuda on 4 lanes, every answer checked against
# the CPU backend. `plain` runs it as it is; otherwise each compute-sanitizer tool named runs
# the test with --target-processes all, which reaches the samplerd it starts, and the tools'
# summaries for both processes are printed (the kernels run 10-100x slower: fewer steps).
#
#   bash scripts/gpu_stress.sh plain [SCENARIOS] [THREADS] [MAX_ELEMENTS]
#   bash scripts/gpu_stress.sh "memcheck racecheck synccheck initcheck" [SCENARIOS] [THREADS]
#        [MAX_ELEMENTS] [SECONDS_PER_TOOL]
# Exits non-zero on a failed comparison or any sanitizer finding. PACK names another pack with
# samplerd and stress_test in bin/ (scripts/gpu_mps.sh stress: .device-pack-mps).
set -uo pipefail
cd "$(dirname "$0")/.."
pack=${PACK:-.device-pack}
[[ $pack != .device-pack ]] || source scripts/device_pack_open.sh  # PACK names another pack
source $pack/env.sh
mode=${1:-plain}
scenarios=${2:-100}
threads=${3:-12}
max_elements=${4:-2097152}
limit=${5:-150}
args=($pack/bin/samplerd --backend=cuda --server_flag=--cuda_streams=4
      --threads="$threads" --scenarios="$scenarios" --max_elements="$max_elements")
if [[ $mode == plain ]]; then
  exec $pack/bin/stress_test "${args[@]}"
fi
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
for tool in $mode; do
  logs=$(mktemp -d)
  extra=()
  [[ $tool == memcheck ]] && extra=(--leak-check=full)
  start=$(date +%s)
  timeout "$limit" "$cs" --tool "$tool" --target-processes all --error-exitcode 99 \
    --log-file "$logs/%p.log" "${extra[@]}" $pack/bin/stress_test "${args[@]}" \
    > "$logs/test.out" 2>&1
  rc=$?
  grep -hE '^stress|^samplerd pid' "$logs/test.out"
  for log in "$logs"/[0-9]*.log; do
    echo "$tool $(basename "$log" .log): $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
  done
  echo "$tool: exit $rc after $(( $(date +%s) - start )) s"
  if [[ $rc -ne 0 ]]; then
    status=1
    tail -30 "$logs/test.out"
    grep -h -B2 -A12 '^=========' "$logs"/[0-9]*.log | head -60
  fi
done
exit $status
