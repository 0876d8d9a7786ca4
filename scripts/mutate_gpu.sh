#!/usr/bin/env bash
# On the GPU machine: runs each GPU mutant that `python3 scripts/mutate.py --gpu-pack` built
# (.device-pack/mutants/ID: cuda_backend_test with one planted kernel bug) and prints whether
# the test caught it: more gtest failures than the unmutated build (mutants/baseline), which
# may itself fail where a kernel is known to be off. Exit status: the number of survivors.
# MUTANT_FILTER (a gtest filter) runs only those tests of each build, to save device time.
# MUTANT_TARBALL (mutate.py's .device-pack/mutants.tar.xz) runs the binaries from it instead,
# with the libraries of LIB_PACK (default .device-pack-mps), so both fit one device call's carry.
# A mutant whose directory holds a `racecheck` file (mutate.py's GPU_RACECHECK: a planted race
# that the data usually outruns) is also run under compute-sanitizer racecheck with the gtest
# filter it names, and each hazard reported counts as a failure (the baseline's too).
set -uo pipefail
cd "$(dirname "$0")/.."
mutants=.device-pack/mutants
if [[ -n ${MUTANT_TARBALL:-} ]]; then
  mutants=$(mktemp -d)
  tar -C "$mutants" -xJf "$MUTANT_TARBALL" || exit 1
  for dir in "$mutants"/*/; do cp "${LIB_PACK:-.device-pack-mps}/env.sh" "$dir"; done
  # env.sh puts its own directory's lib/ first: point it at the pack's.
  for dir in "$mutants"/*/; do ln -s "$PWD/${LIB_PACK:-.device-pack-mps}/lib" "$dir/lib"; done
fi
run() {  # run ID: the gtest failure lines of that build's test, in /tmp/mutant-ID.log
  ( source "$mutants/$1/env.sh"; timeout 300 "$mutants/$1/bin/cuda_backend_test" \
      --gtest_filter="${MUTANT_FILTER:-*}" ) \
    > "/tmp/mutant-$1.log" 2>&1
  local rc=$?
  local n
  n=$(grep -c ': Failure$' "/tmp/mutant-$1.log")
  # A crash or timeout with no failure line still counts as one.
  if (( rc != 0 && n == 0 )); then n=1; fi
  echo "$n"
}
racecheck() {  # racecheck ID FILTER: the hazards compute-sanitizer racecheck reports
  local cs
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  ( source "$mutants/$1/env.sh"; timeout 300 "$cs" --tool racecheck "$mutants/$1/bin/cuda_backend_test" \
      --gtest_filter="$2" ) > "/tmp/mutant-$1-racecheck.log" 2>&1
  local n
  n=$(grep -oE 'RACECHECK SUMMARY: [0-9]+ hazard' "/tmp/mutant-$1-racecheck.log" | grep -oE '[0-9]+')
  echo "${n:-1}"  # no summary (a crash, a timeout): one
}
declare -A base_hazards  # the baseline's racecheck hazards, by filter: one run a filter
base=$(run baseline)
echo "baseline: $base gtest failures ($(grep -E '^\[  FAILED  \] CudaBackend' /tmp/mutant-baseline.log | sed 's/.*CudaBackend\.//; s/ (.*//' | tr '\n' ' '))"
survivors=0
for dir in "$mutants"/*/; do
  id=$(basename "$dir")
  [[ $id == baseline ]] && continue
  n=$(run "$id")
  b=$base; hazards=""
  if [[ -f $dir/racecheck ]]; then
    filter=$(cat "$dir/racecheck")
    [[ -v base_hazards[$filter] ]] || base_hazards[$filter]=$(racecheck baseline "$filter")
    b=$((base + base_hazards[$filter]))
    h=$(racecheck "$id" "$filter")
    n=$((n + h)); hazards="racecheck: $h hazards"
  fi
  if (( n > b )); then
    failed=$(grep -E '^\[  FAILED  \] CudaBackend' "/tmp/mutant-$id.log" | sed 's/.*CudaBackend\.//; s/ (.*//' | sort -u | tr '\n' ' ')
    echo "caught   $id: $n failures ($failed${failed:+${hazards:+; }}$hazards)"
  else
    echo "SURVIVED $id ($n failures, baseline $b)"
    survivors=$((survivors + 1))
  fi
done
echo "$survivors survived"
exit "$survivors"
