#!/usr/bin/env bash
# TLS's cost on the step path (issue 31): `samplerctl bench --mode=stream` p50 against two
# samplerds of the same build on this host, one plaintext on loopback and one serving mutual
# TLS (a throwaway PKI from scripts/make_test_certs.sh), measured alternately, 3 rounds each,
# in one run.
#   bash bench/tls_cost.sh [SAMPLERD] [SAMPLERCTL] [ROWS] [VOCAB] [BACKEND] [SOURCE]
# Defaults: bazel-bin's binaries, 16 rows, V = 129,280, the CPU backend, inline logits.
set -euo pipefail
cd "$(dirname "$0")/.."
samplerd=${1:-bazel-bin/server/samplerd}
samplerctl=${2:-bazel-bin/client/samplerctl}
rows=${3:-16}
vocab=${4:-129280}
backend=${5:-cpu}
source=${6:-inline}
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
bash scripts/make_test_certs.sh "$dir/pki" >/dev/null
start() {  # start NAME FLAGS...: a samplerd whose port lands in $dir/NAME.port
  local name=$1; shift
  "$samplerd" --listen=127.0.0.1:0 --port_file="$dir/$name.port" --backend="$backend" "$@" \
    > "$dir/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do [[ -s $dir/$name.port ]] && return; sleep 0.05; done
  echo "samplerd $name did not start:"; cat "$dir/$name.log"; exit 1
}
start plain
start tls --tls_cert_file="$dir/pki/server/tls.crt" --tls_key_file="$dir/pki/server/tls.key" \
  --tls_client_ca_file="$dir/pki/ca.pem"
tls_flags=(--tls_ca="$dir/pki/ca.pem" --tls_cert="$dir/pki/worker-a.pem"
           --tls_key="$dir/pki/worker-a.key" --tls_server_name=localhost)
p50() {  # p50 NAME EXTRA_FLAGS...
  local name=$1; shift
  "$samplerctl" bench --target="127.0.0.1:$(head -1 "$dir/$name.port")" --mode=stream \
    --rows="$rows" --vocab="$vocab" --source="$source" --steps=2000 --warmup=100 "$@" |
    sed -n 's/.*latency p50 \([0-9.]*\) us.*/\1/p'
}
echo "samplerctl bench --mode=stream --rows=$rows --vocab=$vocab --source=$source, backend $backend"
echo "| round | plaintext p50 us | mutual TLS p50 us |"
echo "|---|---|---|"
for round in 1 2 3; do
  echo "| $round | $(p50 plain) | $(p50 tls "${tls_flags[@]}") |"
done
