#!/bin/sh
# Stop the dockerd that prepare.sh started (by its PID), if it started one.
STATE=${STATE:-/tmp/shardctl-docker}
[ -f "$STATE/dockerd.pid" ] || exit 0
PID=$(cat "$STATE/dockerd.pid")
if kill "$PID" 2>/dev/null; then
    i=0
    while kill -0 "$PID" 2>/dev/null && [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done
fi
rm -f "$STATE/dockerd.pid"
