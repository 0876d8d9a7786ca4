#!/usr/bin/env bash
# Installs samplerd's build and test dependencies from Debian 12 packages (run as root, or with
# sudo available). Idempotent: does nothing when every package is already installed.
#   install-deps.sh          build and test (the README's commands)
#   install-deps.sh build    only what `bazel build //:samplerd //:samplerctl` needs (images)
set -euo pipefail
packages=(
  bazel-bootstrap bazel-rules-java g++ git
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc grpc-proto
  libgtest-dev libgmock-dev libspdlog-dev libfmt-dev prometheus-cpp-dev libbenchmark-dev
  libssl-dev
)
if [[ ${1:-} != build ]]; then
  # Python tests: the client's, run-local's NumPy reference, the deploy/ checks (their PyPI
  # packages go into virtualenvs: scripts/pyvenv.sh).
  packages+=(python3 python3-numpy python3-venv ca-certificates openssl)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} == 0 )); then
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
