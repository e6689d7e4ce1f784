#!/usr/bin/env bash
# `make image`: the application image and, on a host with no image registry, its base and stand-ins
# for postgres, redis and haproxy, all from Debian's packages (docs/operations/container.md).
#   BASE_IMAGE=python:3.13-slim-trixie make image   # where a registry is reachable: official bases
# Exit 3 when no Docker daemon can be had (the caller skips, saying so).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE="${BASE_IMAGE:-controlplane-base:trixie}"
SUITE="${DEBIAN_SUITE:-trixie}"   # Python 3.13: Django 6 needs >= 3.12
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOTFS="${ROOTFS_DIR:-/var/tmp/controlplane-rootfs-$SUITE}"

need() { command -v "$1" >/dev/null 2>&1; }
if ! need dockerd || ! need debootstrap || ! { need docker-compose || docker compose version >/dev/null 2>&1; }; then
  if need apt-get && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null
  fi
fi
DOCKER=$(command -v docker || true)
[ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker  # Debian's client, matching Debian's daemon
if [ -z "$DOCKER" ]; then echo "no docker client"; exit 3; fi
if ! "$DOCKER" info >/dev/null 2>&1; then
  if need dockerd && [ "$(id -u)" = 0 ]; then
    (nohup dockerd >/var/tmp/controlplane-dockerd.log 2>&1 &)
    for _ in $(seq 30); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
  fi
  "$DOCKER" info >/dev/null 2>&1 || { echo "no Docker daemon could be started"; exit 3; }
fi

if [ "$BASE_IMAGE" = "controlplane-base:$SUITE" ] && ! "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
    rm -rf "$ROOTFS"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      "$SUITE" "$ROOTFS" "$MIRROR" >/var/tmp/controlplane-debootstrap.log
  fi
  tar -C "$ROOTFS" -c . | "$DOCKER" import - "$BASE_IMAGE" >/dev/null
fi

# A host whose TLS is inspected: its CA bundle, for the build stage's pip only (Dockerfile).
[ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ] && cp "$PIP_CERT" deploy/certs/host.pem

"$DOCKER" build -q --build-arg BASE_IMAGE="$BASE_IMAGE" -t controlplane:local . >/dev/null
if [ "$BASE_IMAGE" = "controlplane-base:$SUITE" ]; then
  for service in postgres redis haproxy; do
    "$DOCKER" build -q --build-arg BASE_IMAGE="$BASE_IMAGE" -t "controlplane-$service:local" \
      "deploy/images/$service" >/dev/null
  done
fi
"$DOCKER" images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^controlplane' || true
