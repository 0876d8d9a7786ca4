#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu_check.sh packed .device-pack): every gpu test under
# compute-sanitizer, one test at a time with a time limit each (the tools slow the kernels
# 10-100x). memcheck (out-of-bounds and misaligned accesses, leaks), then racecheck (shared
# memory hazards). Prints one line per test and tool and "N clean, N with errors, N timed out";
# exits non-zero on any error.
#
#   bash scripts/gpu_sanitize.sh [TOOLS] [SECONDS_PER_TEST] [PATTERN]
# defaults "memcheck racecheck", 120 s, every test; PATTERN (grep -E) keeps the binary:test pairs
# that match it, e.g. 'Split|Bitwise|token_adjustments'.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_pack_open.sh
source .device-pack/env.sh
tools=${1:-memcheck racecheck}
limit=${2:-120}
pattern=${3:-.}
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# binary:test pairs: every test of cuda_backend_test on its own, cuda_token_adjustments_test whole.
tests=$(.device-pack/bin/cuda_backend_test --gtest_list_tests |
        awk '/^[^ ]/ {suite=$1} /^  / {print "cuda_backend_test:" suite $1}')
tests="$tests cuda_token_adjustments_test:*"
tests=$(tr ' ' '\n' <<< "$tests" | grep -E -- "$pattern" | tr '\n' ' ')
clean=0; dirty=0; slow=0
for tool in $tools; do
  for pair in $tests; do
    bin=${pair%%:*}; t=${pair#*:}
    log=$(mktemp)
    timeout "$limit" "$cs" --tool "$tool" --error-exitcode 99 $([[ $tool == memcheck ]] && echo --leak-check=full) \
      ".device-pack/bin/$bin" --gtest_filter="$t" > "$log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
    if [[ $rc -eq 124 ]]; then
      echo "$tool $bin $t: timed out after $limit s"; slow=$((slow + 1))
    elif [[ $rc -eq 0 ]]; then
      echo "$tool $bin $t: clean ($summary)"; clean=$((clean + 1))
    else
      echo "$tool $bin $t: exit $rc ($summary)"; grep -E "=========" "$log" | head -20
      dirty=$((dirty + 1))
    fi
    rm -f "$log"
  done
done
echo "compute-sanitizer: $clean clean, $dirty with errors, $slow timed out"
[[ $dirty -eq 0 ]]
