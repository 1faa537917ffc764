#!/bin/sh
# The subset of the official image's contract shardctl relies on:
# POSTGRES_PASSWORD / POSTGRES_HOST_AUTH_METHOD, POSTGRES_USER, POSTGRES_DB, PGDATA,
# and `postgres -c name=value ...` as the command.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "${1:-postgres}" = "postgres" ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
    method=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$method" != "trust" ]; then
        echo "error: set POSTGRES_PASSWORD or POSTGRES_HOST_AUTH_METHOD=trust" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    initdb -D "$PGDATA" -U "$POSTGRES_USER" -E UTF8 --locale=C.UTF-8 --auth-local=trust \
        --auth-host="$method" --pwfile="$pwfile" >/dev/null
    rm -f "$pwfile"
    printf 'host all all all %s\nhost replication all all %s\n' "$method" "$method" >>"$PGDATA/pg_hba.conf"
    printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
    if [ "$POSTGRES_DB" != "postgres" ]; then
        postgres --single -D "$PGDATA" postgres <<SQL >/dev/null
CREATE DATABASE "$POSTGRES_DB";
SQL
    fi
fi
if [ "${1:-postgres}" = "postgres" ]; then
    shift || true
    exec postgres -D "$PGDATA" "$@"
fi
exec "$@"
