#!/usr/bin/env bash
# The image and pod check (issue 32), so deploy/ stays true: builds the CPU image from
# deploy/Dockerfile and a worker image from deploy/worker.Dockerfile, runs both as one pod laid
# out as deploy/'s sidecar pod (one IPC namespace, so one /dev/shm; one loopback; both uid
# 10001; samplerd's root filesystem read-only), and checks:
#   - the worker's examples/decode_loop.py over a shared-memory region: every step answered;
#   - the probe commands the manifests run: readiness `samplerctl health` (SERVING), liveness
#     `samplerctl health --live`;
#   - the metrics endpoint: the steps the worker sent are counted;
#   - SIGTERM (`podman stop`) drains: exit 0, every step read was answered.
# Prints the images' sizes. Exit status: 0 passed, 1 failed, 3 podman cannot run here.
#   bash deploy/tests/pod_check.sh        (as root; scripts/podman-setup.sh installs podman)
set -uo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF=$PWD/deploy/tests/containers.conf
bash scripts/podman-setup.sh
rc=$?
[[ $rc -eq 0 ]] || exit "$rc"
set -e
tag=samplerd-check
pod=samplerd-check-$$
fail() { echo "pod_check: FAILED: $*"; podman logs "$pod-samplerd" 2>&1 | tail -20 || true; exit 1; }
cleanup() { podman pod rm -f "$pod" >/dev/null 2>&1 || true; }
trap cleanup EXIT
build() {  # build NAME DOCKERFILE: its log is shown only when it fails
  local log
  log=$(mktemp)
  echo "pod_check: building localhost/$tag:$1 ($2)"
  if ! podman build --network=host -f "$2" -t "localhost/$tag:$1" . > "$log" 2>&1; then
    tail -30 "$log"; rm -f "$log"; fail "podman build -f $2"
  fi
  rm -f "$log"
}
build samplerd deploy/Dockerfile
build worker deploy/worker.Dockerfile
size() { podman image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}'; }
base=$(podman image inspect --format '{{.Size}}' docker.io/library/debian:12-slim |
       awk '{printf "%.0f MB", $1 / 1e6}')
echo "pod_check: image sizes: samplerd $(size "localhost/$tag:samplerd"), worker $(size "localhost/$tag:worker") (debian:12-slim here: $base)"

# Free ports on this host (the pod shares the host's network: podman here needs --network=host).
read -r grpc_port metrics_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
podman pod create --name "$pod" --network=host --share ipc,uts,net >/dev/null
podman run -d --pod "$pod" --name "$pod-samplerd" --user 10001:10001 --read-only \
  "localhost/$tag:samplerd" --listen="127.0.0.1:$grpc_port" \
  --metrics_address="127.0.0.1:$metrics_port" --shutdown_grace_ms=500 >/dev/null
health() { podman exec "$pod-samplerd" samplerctl health --target="127.0.0.1:$grpc_port" --timeout_ms=900 "$@"; }
for _ in $(seq 100); do health >/dev/null 2>&1 && break; sleep 0.2; done
[[ $(health) == SERVING ]] || fail "readiness: samplerctl health is not SERVING"
health --live >/dev/null || fail "liveness: samplerctl health --live failed"
echo "pod_check: readiness (samplerctl health) SERVING, liveness (--live) passed"

out=$(podman run --rm --pod "$pod" --user 10001:10001 "localhost/$tag:worker" \
        /opt/examples/decode_loop.py "127.0.0.1:$grpc_port") || fail "the worker's decode loop: $out"
echo "pod_check: worker: $out"
[[ $out == "generated 32 tokens x 8 sequences;"* ]] || fail "unexpected worker output: $out"

metrics=$(python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$metrics_port/metrics', timeout=10).read().decode())")
prefill=$(echo "$metrics" | awk '/^samplerd_step_seconds_count\{kind="PREFILL"\}/{print $2}')
decode=$(echo "$metrics" | awk '/^samplerd_step_seconds_count\{kind="DECODE"\}/{print $2}')
echo "pod_check: metrics: DECODE steps counted ${decode:-none}, PREFILL ${prefill:-none}"
[[ ${decode%.*} == 32 ]] || fail "metrics: expected the worker's 32 decode steps, found '${decode:-none}'"

podman stop -t 30 "$pod-samplerd" >/dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "$pod-samplerd")
last=$(podman logs "$pod-samplerd" 2>&1 | grep "samplerd stopped" | tail -1)
echo "pod_check: SIGTERM: exit $code; $last"
[[ $code == 0 ]] || fail "samplerd exited $code after SIGTERM"
[[ $last =~ ([0-9]+)\ steps\ read,\ ([0-9]+)\ answered && ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]] ||
  fail "drain: not every step read was answered ($last)"
echo "pod_check: PASSED"
