#!/usr/bin/env bash
# Prints the path of a Python virtualenv holding a requirements file's pinned packages from
# PyPI, creating it first if needed. The venv is cached under ~/.cache/samplerd, keyed by the
# file's content and the Python version, so a changed pin builds a new one.
#   scripts/pyvenv.sh client/python/tests/requirements.txt
# Exit status 3 (and the reason on stderr) when PyPI cannot be reached at all, so callers can
# tell "no network" from a broken requirement (1).
set -euo pipefail
req=$1
[[ -f $req ]] || { echo "pyvenv: no file $req" >&2; exit 2; }
key=$( { cat "$req"; python3 --version; } | sha256sum | cut -c1-16)
name=$(echo "$req" | tr '/' '-' | sed 's/\.txt$//')
venv=${SAMPLERD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/samplerd}/venv-$name-$key
if [[ ! -f $venv/.complete ]]; then
  rm -rf "$venv"
  echo "pyvenv: building $venv from $req" >&2
  python3 -m venv "$venv" >&2
  if ! { "$venv/bin/pip" install -q --disable-pip-version-check --upgrade pip >&2 &&
         "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2; }; then
    # Which was it: PyPI unreachable (no route, or TLS that this machine cannot verify), or
    # a requirement that does not resolve?
    if ! why=$("$venv/bin/python" - 2>&1 <<'PY'
import urllib.request
urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=30).read(1)
PY
    ); then
      rm -rf "$venv"
      echo "pyvenv: PyPI is unreachable from here: $(echo "$why" | tail -1)" >&2
      exit 3
    fi
    rm -rf "$venv"
    exit 1
  fi
  touch "$venv/.complete"
fi
echo "$venv"
