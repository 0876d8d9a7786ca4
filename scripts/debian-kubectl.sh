#!/usr/bin/env bash
# Prints the path of Debian 12's kubectl (package kubernetes-client, 1.20: `kubectl kustomize`
# is kustomize v2), the renderer CI checks deploy/ with. The package is downloaded and unpacked
# into a cache directory rather than installed: a machine may already have another kubectl
# package owning /usr/bin/kubectl.
set -euo pipefail
cache=${SAMPLERD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/samplerd}/kubernetes-client
bin=$cache/root/usr/bin/kubectl
if [[ ! -x $bin ]]; then
  mkdir -p "$cache"
  ( cd "$cache" && rm -f kubernetes-client_*.deb &&
    { apt-get download kubernetes-client >/dev/null 2>&1 ||
      { apt-get update -qq && apt-get download kubernetes-client >/dev/null; }; } &&
    dpkg-deb -x kubernetes-client_*.deb root ) >&2
fi
echo "$bin"
