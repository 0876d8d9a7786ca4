#!/usr/bin/env bash
# Makes podman usable for the image and pod check (deploy/tests/pod_check.sh), as root:
# installs podman, runc and catatonit (Debian 12 packages) when missing, and makes sure the base images
# debian:12 and debian:12-slim exist: pulled from Docker Hub where a registry is reachable, else
# made locally from a debootstrap minbase root of Debian 12 (bigger than the real -slim image;
# apt and pip work inside it). Run with CONTAINERS_CONF=deploy/tests/containers.conf.
# Exit status: 0 ready; 3 podman cannot run containers here (the reason on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/tests/containers.conf}
# Inside a chroot (a fresh-machine rehearsal) podman cannot store images, and its storage
# mounts would outlive the run: said, and nothing installed or mounted.
if command -v ischroot >/dev/null && ischroot; then
  echo "podman-setup: this is a chroot: podman cannot run containers here" >&2
  exit 3
fi
# catatonit: the pause process of a pod's infra container.
if ! command -v podman >/dev/null || ! command -v runc >/dev/null ||
   ! dpkg-query -W -f='${Status}' catatonit 2>/dev/null | grep -q "install ok installed"; then
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
  echo "podman-setup: installing podman runc catatonit" >&2
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    podman runc catatonit fuse-overlayfs slirp4netns uidmap >/dev/null
fi
if ! podman info >/dev/null 2>/tmp/podman-setup.err; then
  echo "podman-setup: podman cannot run here: $(tail -1 /tmp/podman-setup.err)" >&2
  exit 3
fi
if ! podman image exists docker.io/library/debian:12; then
  if ! timeout 120 podman pull -q docker.io/library/debian:12 >/dev/null 2>&1 ||
     ! timeout 120 podman pull -q docker.io/library/debian:12-slim >/dev/null 2>&1; then
    echo "podman-setup: no registry reachable; making debian:12 with debootstrap" >&2
    command -v debootstrap >/dev/null ||
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    root=$(mktemp -d /var/tmp/samplerd-debian12.XXXXXX)
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [[ -n $mirror ]] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    debootstrap --variant=minbase bookworm "$root" "${mirror:-http://deb.debian.org/debian}" \
      > /tmp/podman-setup-debootstrap.log 2>&1 ||
      { echo "podman-setup: debootstrap failed (/tmp/podman-setup-debootstrap.log)" >&2; exit 1; }
    # This host's trusted roots and pip settings, so apt and pip inside RUN steps reach their
    # registries through whatever proxy the host uses.
    mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/" 2>/dev/null || true
    [[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/pip.conf"
    # Storing an image is where podman fails inside a chroot ("remount /: invalid argument").
    if ! tar -C "$root" -c . | podman import - docker.io/library/debian:12 >/dev/null 2>/tmp/podman-setup.err; then
      rm -rf "$root"
      echo "podman-setup: podman cannot store images here: $(tail -1 /tmp/podman-setup.err)" >&2
      exit 3
    fi
    rm -rf "$root"
    podman tag docker.io/library/debian:12 docker.io/library/debian:12-slim
  fi
fi
if ! podman run --rm --network=host docker.io/library/debian:12 true 2>/tmp/podman-setup.err; then
  echo "podman-setup: podman cannot run a container here: $(tail -1 /tmp/podman-setup.err)" >&2
  exit 3
fi
echo "podman-setup: ready ($(podman --version))" >&2
