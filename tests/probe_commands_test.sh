#!/usr/bin/env bash
# The commands deploy/'s sidecar probes run, against a real samplerd process: `samplerctl
# health` (startup, readiness) passes only while samplerd is SERVING; `--live` (liveness)
# passes whenever it answers, so a sidecar draining after SIGTERM is not restarted by its
# liveness probe; both fail once nothing answers.
#   probe_commands_test.sh SAMPLERD SAMPLERCTL
set -uo pipefail
samplerd=$1
samplerctl=$2
dir=$(mktemp -d)
"$samplerd" --listen=127.0.0.1:0 --port_file="$dir/port" --backend=cpu --threads=1 \
  --shutdown_grace_ms=5000 --log_level=warn &
pid=$!
for _ in $(seq 400); do [[ -s $dir/port ]] && break; sleep 0.05; done
target="127.0.0.1:$(head -1 "$dir/port")"
failed=0
# check EXPECTED_EXIT EXPECTED_OUTPUT WHAT COMMAND...
check() {
  local want_rc=$1 want_out=$2 what=$3
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne $want_rc || $out != *"$want_out"* ]]; then
    echo "FAIL: $what: exit $rc, '$out' (want exit $want_rc, '$want_out')"
    failed=1
  else
    echo "ok: $what: exit $rc, '$out'"
  fi
}
check 0 SERVING "serving: readiness" "$samplerctl" health --target="$target" --timeout_ms=2000
check 0 SERVING "serving: liveness" "$samplerctl" health --live --target="$target" --timeout_ms=2000
kill -TERM "$pid"
sleep 1  # inside the 5 s grace: health NOT_SERVING, the server still answers
check 1 NOT_SERVING "draining: readiness fails" \
  "$samplerctl" health --target="$target" --timeout_ms=2000
check 0 NOT_SERVING "draining: liveness passes" \
  "$samplerctl" health --live --target="$target" --timeout_ms=2000
wait "$pid"
check 1 UNAVAILABLE "stopped: liveness fails" \
  "$samplerctl" health --live --target="$target" --timeout_ms=1000
rm -rf "$dir"
exit $failed
