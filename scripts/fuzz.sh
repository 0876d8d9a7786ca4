#!/usr/bin/env bash
# Builds samplerd's libFuzzer targets with Debian's clang (ASan + UBSan) and runs them.
#
#   bash scripts/fuzz.sh step 600          # one target for 600 s
#   bash scripts/fuzz.sh all 60            # every target, 60 s each (CI runs this with 30)
#
# Targets: step (SampleRequestList -> RunStep (convert, plan, CPU backend, verify), against a
# registered shm region; structure-aware mutator) and run_local (the JSON of samplerctl
# run-local). Each starts from its checked-in seeds (fuzz/seeds/TARGET) and every crash ever
# found (fuzz/regressions/TARGET); a new crash is written to fuzz/regressions/TARGET/ (commit
# it: //fuzz:TARGET_fuzzer_replay_test replays it from then on) and fails this script.
# Prints, per target, "fuzz TARGET: N executions in S s, cov C, ft F, peak RSS M MB".
# Bazel is not used: the fuzzers need clang's -fsanitize=fuzzer, the Bazel build uses g++.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-all}
seconds=${2:-60}
bash scripts/install-deps.sh
need=()
for p in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if (( ${#need[@]} > 0 )); then
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

out=${FUZZ_BUILD_DIR:-.fuzz-build}
mkdir -p "$out/gen" "$out/obj"
# Regenerated only when the proto changed: the generated header's time decides rebuilds below.
if [[ ! -f $out/gen/samplerd/v1/sampler.pb.h || proto/samplerd/v1/sampler.proto -nt $out/gen/samplerd/v1/sampler.pb.h ]]; then
  protoc --cpp_out="$out/gen" -Iproto proto/samplerd/v1/sampler.proto
fi
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -ffp-contract=off -I. -I"$out/gen"
       -fsanitize=address,undefined -fno-sanitize-recover=all)
libs=(-lprotobuf -labsl_statusor -labsl_status -labsl_cord -labsl_cordz_info
      -labsl_cordz_handle -labsl_cordz_functions -labsl_cord_internal -labsl_exponential_biased
      -labsl_synchronization -labsl_graphcycles_internal -labsl_stacktrace -labsl_symbolize
      -labsl_debugging_internal -labsl_demangle_internal -labsl_malloc_internal -labsl_time
      -labsl_civil_time -labsl_time_zone -labsl_str_format_internal -labsl_strings
      -labsl_strings_internal -labsl_int128 -labsl_hash -labsl_city -labsl_low_level_hash
      -labsl_raw_hash_set -labsl_hashtablez_sampler -labsl_throw_delegate -labsl_base
      -labsl_spinlock_wait -labsl_raw_logging_internal -labsl_log_severity -lpthread)
# The code under test: the core, the step pipeline and conversion, the server's registry,
# run-local.
sources=("$out/gen/samplerd/v1/sampler.pb.cc" pipeline/proto_convert.cc pipeline/step_pipeline.cc
         server/buffer_registry.cc
         server/shm_region.cc server/cuda_ipc_handle.cc client/run_local.cc
         fuzz/proto_mutator.cc)
for f in sampler/*.cc; do
  # Test-only libraries (the float64 reference, gtest comparisons) are not fuzzed code.
  case $f in *_test.cc|sampler/reference_sampler.cc|sampler/backend_compare.cc) ;; *) sources+=("$f") ;; esac
done
# An object is rebuilt when its source or any header is newer: a header that changed a
# struct's layout under objects built before it made a false crash (a stale object reading
# another's layout) in an incremental build.
newest_header=$(ls -t $(git ls-files '*.h' '*.cuh') "$out/gen/samplerd/v1/sampler.pb.h" | head -1)
objects=()
for src in "${sources[@]}"; do
  obj="$out/obj/$(echo "$src" | tr '/' '_').o"
  if [[ ! -f $obj || $src -nt $obj || $newest_header -nt $obj ]]; then
    clang++ "${flags[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
  objects+=("$obj")
done

run() {
  local name=$1
  shift
  local bin="$out/${name}_fuzzer"
  clang++ "${flags[@]}" -fsanitize=fuzzer -DSAMPLERD_LIBFUZZER "fuzz/${name}_fuzzer.cc" \
    "${objects[@]}" "${libs[@]}" -o "$bin"
  local corpus="$out/corpus/$name"
  mkdir -p "$corpus" "fuzz/regressions/$name"
  local log="$out/${name}.log"
  local rc=0
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    "$bin" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2560 \
      -timeout=10 -max_len=65536 -artifact_prefix="fuzz/regressions/$name/" "$@" \
      "$corpus" "fuzz/seeds/$name" "fuzz/regressions/$name" > "$log" 2>&1 || rc=$?
  local execs cov ft rss
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
  rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  echo "fuzz $name: $execs executions in $seconds s, cov $cov, ft $ft, peak RSS $rss MB"
  if [[ $rc -ne 0 ]]; then
    tail -40 "$log"
    echo "fuzz $name: FAILED (exit $rc); the input is in fuzz/regressions/$name/"
    return 1
  fi
}

status=0
if [[ $target == step || $target == all ]]; then run step || status=1; fi
if [[ $target == run_local || $target == all ]]; then
  run run_local -dict=fuzz/run_local.dict || status=1
fi
exit $status
