#!/usr/bin/env bash
# On the GPU machine: runs each GPU mutant that `python3 scripts/mutate.py --gpu-pack` built
# (.device-pack/mutants/ID: cuda_backend_test with one planted kernel bug) and prints whether
# the test caught it: more gtest failures than the unmutated build (mutants/baseline), which
# may itself fail where a kernel is known to be off. Exit status: the number of survivors.
# MUTANT_FILTER (a gtest filter) runs only those tests of each build, to save device time.
set -uo pipefail
cd "$(dirname "$0")/.."
run() {  # run ID: the gtest failure lines of that build's test, in /tmp/mutant-ID.log
  ( source ".device-pack/mutants/$1/env.sh"; timeout 300 ".device-pack/mutants/$1/bin/cuda_backend_test" \
      --gtest_filter="${MUTANT_FILTER:-*}" ) \
    > "/tmp/mutant-$1.log" 2>&1
  local rc=$?
  local n
  n=$(grep -c ': Failure$' "/tmp/mutant-$1.log")
  # A crash or timeout with no failure line still counts as one.
  if (( rc != 0 && n == 0 )); then n=1; fi
  echo "$n"
}
base=$(run baseline)
echo "baseline: $base gtest failures ($(grep -E '^\[  FAILED  \] CudaBackend' /tmp/mutant-baseline.log | sed 's/.*CudaBackend\.//; s/ (.*//' | tr '\n' ' '))"
survivors=0
for dir in .device-pack/mutants/*/; do
  id=$(basename "$dir")
  [[ $id == baseline ]] && continue
  n=$(run "$id")
  if (( n > base )); then
    failed=$(grep -E '^\[  FAILED  \] CudaBackend' "/tmp/mutant-$id.log" | sed 's/.*CudaBackend\.//; s/ (.*//' | sort -u | tr '\n' ' ')
    echo "caught   $id: $n failures ($failed)"
  else
    echo "SURVIVED $id ($n failures, baseline $base)"
    survivors=$((survivors + 1))
  fi
done
echo "$survivors survived"
exit "$survivors"
