#!/usr/bin/env bash
# Runs every samplerd test that needs no GPU (tests tagged `gpu` run on the GPU machine).
# Installs what it needs first. Ends with "N passed, N failed" (test cases, from the test
# XML of each target; a target that fails to build or run counts as one failure) and exits
# with Bazel's status.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh || exit 1
log=$(mktemp)
# Everything builds first, the gpu-tagged tests and benchmarks included (where the CUDA toolkit
# is present): CI compiles them; they run on the GPU machine (scripts/gpu_check.sh).
bazel build //... 2>&1 | tail -3
build_rc=${PIPESTATUS[0]}
bazel test //... --test_tag_filters=-gpu --build_tests_only "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [[ $build_rc -ne 0 && $rc -eq 0 ]]; then rc=$build_rc; echo "bazel build //... failed"; fi
passed=0
failed=0
testlogs=$(bazel info bazel-testlogs 2>/dev/null)
while read -r target status; do
  xml="$testlogs/${target#//}"
  xml="${xml/://}/test.xml"
  if [[ $status == PASSED || $status == FAILED ]] && [[ -f $xml ]]; then
    tests=$(grep -o '<testsuites [^>]*' "$xml" | grep -o ' tests="[0-9]*"' | grep -o '[0-9]*' | head -1)
    fails=$(grep -o '<testsuites [^>]*' "$xml" | grep -o ' failures="[0-9]*"' | grep -o '[0-9]*' | head -1)
    errors=$(grep -o '<testsuites [^>]*' "$xml" | grep -o ' errors="[0-9]*"' | grep -o '[0-9]*' | head -1)
    tests=${tests:-0}; fails=${fails:-0}; errors=${errors:-0}
    bad=$((fails + errors))
    if [[ $status == FAILED && $bad -eq 0 ]]; then bad=1; fi
    passed=$((passed + tests - fails - errors))
    failed=$((failed + bad))
  else
    failed=$((failed + 1))
  fi
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|FAILED TO BUILD|NO STATUS|TIMEOUT)' "$log" |
         sed -E 's/\(cached\) //' | awk '{print $1, $2}')
rm -f "$log"
# In CI, stop the Bazel server: a daemon left running would hold the build root's mounts
# (a chroot rehearsal cannot unmount them) and the machine's memory.
if [[ ${CI:-} == true ]]; then bazel shutdown >/dev/null 2>&1 || true; fi
if [[ $rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi
if [[ $build_rc -ne 0 ]]; then failed=$((failed + 1)); fi
echo "$passed passed, $failed failed"
exit "$rc"
