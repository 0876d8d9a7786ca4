#!/usr/bin/env bash
# Runs every samplerd test that needs no GPU (tests tagged `gpu` run on the GPU machine).
# Installs what it needs first. Five stages:
#   1. bazel build //... (the gpu-tagged targets too, where the CUDA toolkit exists), then
#      bazel test //... --test_tag_filters=-gpu;
#   2. Python: the client's tests (client/python/tests, xgrammar included) against the
#      samplerd just built, and the deploy/ checks (render, kubernetes-validate, checkov), each
#      in a venv of pinned PyPI packages (scripts/pyvenv.sh; skip with SAMPLERD_SKIP_PYTHON=1);
#   3. the Bazel tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#      (--config=asan; skip with SAMPLERD_SKIP_ASAN=1);
#   4. a short libFuzzer run of each fuzz target (scripts/fuzz.sh all 30; skip with
#      SAMPLERD_SKIP_FUZZ=1);
#   5. the images and the pod: deploy/Dockerfile and deploy/worker.Dockerfile built with podman
#      and run as deploy/'s pod (deploy/tests/pod_check.sh; skip with SAMPLERD_SKIP_PODS=1;
#      where podman cannot run it says so in the summary, never counted as passed).
# Ends with "N passed, N failed, N skipped" (test cases, from the test XML of each target; a target that
# fails to build or run counts as one failure; each fuzz target counts as one) and exits
# non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh || exit 1
passed=0
skipped_cases=0
failed=0
skipped_suites=()

# Adds one `bazel test` run's test cases to the totals. $1: the run's log; $2: its testlogs.
count_results() {
  local log=$1 testlogs=$2 target status xml tests fails errors bad skips
  while read -r target status; do
    xml="$testlogs/${target#//}"
    xml="${xml/://}/test.xml"
    if [[ $status == PASSED || $status == FAILED ]] && [[ -f $xml ]]; then
      tests=$(grep -o '<testsuites [^>]*' "$xml" | grep -o ' tests="[0-9]*"' | grep -o '[0-9]*' | head -1)
      fails=$(grep -o '<testsuites [^>]*' "$xml" | grep -o ' failures="[0-9]*"' | grep -o '[0-9]*' | head -1)
      errors=$(grep -o '<testsuites [^>]*' "$xml" | grep -o ' errors="[0-9]*"' | grep -o '[0-9]*' | head -1)
      # A GTEST_SKIP is a test case that did not run: counted as skipped, never as passed.
      skips=$(grep -c 'result="skipped"' "$xml")
      tests=${tests:-0}; fails=${fails:-0}; errors=${errors:-0}; skips=${skips:-0}
      bad=$((fails + errors))
      if [[ $status == FAILED && $bad -eq 0 ]]; then bad=1; fi
      passed=$((passed + tests - fails - errors - skips))
      skipped_cases=$((skipped_cases + skips))
      failed=$((failed + bad))
    else
      failed=$((failed + 1))
    fi
  done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|FAILED TO BUILD|NO STATUS|TIMEOUT)' "$log" |
           sed -E 's/\(cached\) //' | awk '{print $1, $2}')
}

# Runs `bazel test` with the given flags over the non-gpu tests and counts them; returns its rc.
run_suite() {
  local log rc
  log=$(mktemp)
  bazel test //... --test_tag_filters=-gpu --build_tests_only "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  count_results "$log" "$(bazel info "$@" bazel-testlogs 2>/dev/null)"
  if [[ $rc -ne 0 ]] && ! grep -qE '^//[^ ]+ +(\(cached\) )?(FAILED|FAILED TO BUILD|NO STATUS|TIMEOUT)' "$log"; then
    failed=$((failed + 1))  # failed before any test ran
  fi
  rm -f "$log"
  return "$rc"
}

# Runs pytest in the venv of a requirements file and counts its test cases (skipped ones count
# as neither). $1: the requirements file; $2: a command run in the venv first (or ""); the rest:
# pytest's arguments. Returns pytest's rc.
py_suite() {
  local req=$1 setup=$2 venv xml rc tests fails errors skipped
  shift 2
  venv=$(bash scripts/pyvenv.sh "$req")
  rc=$?
  if [[ $rc -eq 3 ]]; then
    # No PyPI at all (e.g. a sandbox whose TLS proxy this root does not trust): these suites
    # cannot run here. Said loudly, and in the summary line; not counted as passed.
    echo "py_suite: SKIPPED $req: PyPI unreachable"
    skipped_suites+=("$req")
    return 0
  elif [[ $rc -ne 0 ]]; then
    echo "py_suite: could not build the venv for $req"; failed=$((failed + 1)); return 1
  fi
  if [[ -n $setup ]] && ! PATH="$venv/bin:$PATH" bash -c "$setup"; then
    echo "py_suite: '$setup' failed"; failed=$((failed + 1)); return 1
  fi
  xml=$(mktemp --suffix=.xml)
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$xml" "$@"
  rc=$?
  tests=$(grep -o '<testsuite [^>]*' "$xml" | grep -o ' tests="[0-9]*"' | grep -o '[0-9]*' | head -1)
  fails=$(grep -o '<testsuite [^>]*' "$xml" | grep -o ' failures="[0-9]*"' | grep -o '[0-9]*' | head -1)
  errors=$(grep -o '<testsuite [^>]*' "$xml" | grep -o ' errors="[0-9]*"' | grep -o '[0-9]*' | head -1)
  skipped=$(grep -o '<testsuite [^>]*' "$xml" | grep -o ' skipped="[0-9]*"' | grep -o '[0-9]*' | head -1)
  tests=${tests:-0}; fails=${fails:-0}; errors=${errors:-0}; skipped=${skipped:-0}
  passed=$((passed + tests - fails - errors - skipped))
  skipped_cases=$((skipped_cases + skipped))
  failed=$((failed + fails + errors))
  if [[ $rc -ne 0 && $((fails + errors)) -eq 0 ]]; then failed=$((failed + 1)); fi
  rm -f "$xml"
  return "$rc"
}

rc=0
# Everything builds first, the gpu-tagged tests and benchmarks included (where the CUDA toolkit
# is present): CI compiles them; they run on the GPU machine (scripts/gpu_check.sh).
bazel build //... 2>&1 | tail -3
if [[ ${PIPESTATUS[0]} -ne 0 ]]; then echo "bazel build //... failed"; rc=1; failed=$((failed + 1)); fi
run_suite || rc=1
if [[ ${SAMPLERD_SKIP_PYTHON:-} != 1 ]]; then
  echo "=== Python: the client against a real samplerd (CPU backend), then the deploy/ checks"
  # The client is installed the way a user installs it (its build compiles the .proto).
  py_suite client/python/tests/requirements.txt \
    "pip install -q --disable-pip-version-check --force-reinstall --no-deps ./client/python" \
    client/python/tests || rc=1
  py_suite deploy/tests/requirements.txt "" deploy/tests || rc=1
fi
echo "=== the mutation script's mutants still apply (scripts/mutate.py --check)"
if python3 scripts/mutate.py --check; then passed=$((passed + 1)); else failed=$((failed + 1)); rc=1; fi
if [[ ${SAMPLERD_SKIP_ASAN:-} != 1 ]]; then
  echo "=== the same tests under AddressSanitizer + UndefinedBehaviorSanitizer (--config=asan)"
  run_suite --config=asan || rc=1
fi
if [[ ${SAMPLERD_SKIP_FUZZ:-} != 1 ]]; then
  echo "=== a short fuzz run of each target (scripts/fuzz.sh all 30)"
  fuzz_log=$(mktemp)
  bash scripts/fuzz.sh all 30 2>&1 | tee "$fuzz_log"
  [[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1
  ok=$(grep -cE '^fuzz [a-z_]+: [0-9]+ executions' "$fuzz_log" || true)
  bad=$(grep -cE '^fuzz [a-z_]+: FAILED' "$fuzz_log" || true)
  passed=$((passed + ok - bad))
  failed=$((failed + bad))
  if [[ $rc -ne 0 && $ok -eq 0 && $bad -eq 0 ]]; then failed=$((failed + 1)); fi
  rm -f "$fuzz_log"
fi
pods_note=""
if [[ ${SAMPLERD_SKIP_PODS:-} != 1 ]]; then
  echo "=== the images and the pod (deploy/tests/pod_check.sh: podman)"
  bash deploy/tests/pod_check.sh
  case $? in
    0) passed=$((passed + 1)) ;;
    # podman cannot run containers here (a chroot without cgroups, no user namespaces): said
    # loudly, and in the summary line; never counted as passed.
    3) pods_note="not run (podman cannot run containers here): deploy/tests/pod_check.sh" ;;
    *) failed=$((failed + 1)); rc=1 ;;
  esac
else
  pods_note="not run (SAMPLERD_SKIP_PODS=1): deploy/tests/pod_check.sh"
fi
# In CI, stop the Bazel server: a daemon left running would hold the build root's mounts
# (a chroot rehearsal cannot unmount them) and the machine's memory.
if [[ ${CI:-} == true ]]; then bazel shutdown >/dev/null 2>&1 || true; fi
if [[ $rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi
if (( ${#skipped_suites[@]} > 0 )); then
  echo "not run (PyPI unreachable): ${skipped_suites[*]}"
fi
[[ -n $pods_note ]] && echo "$pods_note"
echo "$passed passed, $failed failed, $skipped_cases skipped"
exit "$rc"
