#!/bin/sh
# The acceptance run of the Docker engine, as a user types it (after examples/docker/prepare.sh):
# a 3-container sandbox; init, migrate, verify; move 8 shards between containers; verify;
# then sandbox down --destroy, and a check that no container, volume or network is left.
# Usage: examples/docker/acceptance.sh [IMAGE]
set -eu
IMAGE=${1:-local/shardctl-postgres:18}
DIR=$(mktemp -d /tmp/shardctl-acceptance-XXXXXX)
rmdir "$DIR"
export SHARDCTL_CONFIG="$DIR/shardctl.yaml"
step() { echo "\$ $*"; "$@"; echo "  -> exit $?"; }
step shardctl sandbox up --engine docker --hosts 3 --shards 24 --image "$IMAGE" --dir "$DIR"
SID=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['sandbox_id'])" "$DIR/docker.json")
step shardctl init
step shardctl migrate
step shardctl verify
step shardctl move-shard 0-7 --to pg3
step shardctl verify
step shardctl sandbox status --dir "$DIR"
step shardctl sandbox down --destroy --dir "$DIR"
left=$(docker ps -aq --filter "label=io.shardctl.sandbox=$SID" | wc -l)
vols=$(docker volume ls -q --filter "label=io.shardctl.sandbox=$SID" | wc -l)
nets=$(docker network ls -q --filter "label=io.shardctl.sandbox=$SID" | wc -l)
echo "left behind: $left containers, $vols volumes, $nets networks; directory exists: $([ -e "$DIR" ] && echo yes || echo no)"
[ "$left$vols$nets" = "000" ] && [ ! -e "$DIR" ]
