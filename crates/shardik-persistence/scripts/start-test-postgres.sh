#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server for the shardik-persistence tests in a temporary
# directory and prints its URL on stdout (everything else goes to stderr):
#
#   export SHARDIK_PG_URL=$(crates/shardik-persistence/scripts/start-test-postgres.sh)
#   cargo test -p shardik-persistence
#
# The server runs as the current user; when run as root (initdb refuses root) it runs as the
# `postgres` system user instead. It listens on 127.0.0.1 only, trusts local connections and
# runs with fsync off: for tests, never for data. Stop it with the command printed on stderr.
# Environment: PG_BIN (the server's bin directory), PG_PORT (default: the first free port
# from 54329).
set -euo pipefail

PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)}
if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
    echo "start-test-postgres: no PostgreSQL server binaries found (install postgresql, or set PG_BIN)" >&2
    exit 1
fi

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
PORT=${PG_PORT:-54329}
if [ -z "${PG_PORT:-}" ]; then
    while port_in_use "$PORT"; do PORT=$((PORT + 1)); done
fi

DIR=$(mktemp -d "${TMPDIR:-/tmp}/shardik-pg.XXXXXX")
if [ "$(id -u)" = 0 ]; then
    chown postgres "$DIR"
    run() { runuser -u postgres -- "$@"; }
else
    run() { "$@"; }
fi

run "$PG_BIN/initdb" -D "$DIR/data" -U shardik --auth=trust -E UTF8 >"$DIR/initdb.log" 2>&1 || {
    cat "$DIR/initdb.log" >&2
    exit 1
}
run "$PG_BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
    -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
    start >/dev/null || {
    cat "$DIR/server.log" >&2
    exit 1
}

echo "start-test-postgres: server in $DIR on port $PORT; stop with:" >&2
if [ "$(id -u)" = 0 ]; then
    echo "  runuser -u postgres -- $PG_BIN/pg_ctl -D $DIR/data stop" >&2
else
    echo "  $PG_BIN/pg_ctl -D $DIR/data stop" >&2
fi
echo "postgres://shardik@127.0.0.1:$PORT/postgres"
