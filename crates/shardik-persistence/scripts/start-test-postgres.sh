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
# It also accepts TLS, with a certificate for 127.0.0.1 signed by a throwaway CA (made with
# openssl; without openssl the server is plaintext only): the CA certificate is copied to
# $PG_CA_OUT if set, for the TLS tests (SHARDIK_PG_CA):
#
#   export SHARDIK_PG_CA=/tmp/shardik-pg-ca.pem
#   export SHARDIK_PG_URL=$(PG_CA_OUT=$SHARDIK_PG_CA crates/shardik-persistence/scripts/start-test-postgres.sh)
#
# Environment: PG_BIN (the server's bin directory), PG_PORT (default: the first free port
# from 54329), PG_CA_OUT (see above).
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
SSL_OPTS=""
if command -v openssl >/dev/null 2>&1; then
    (
        cd "$DIR"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 \
            -subj "/CN=shardik-test-ca" -keyout ca.key -out ca.pem
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
            -keyout server.key -out server.csr
        printf "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n" >ext.cnf
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 7 \
            -extfile ext.cnf -out server.pem
        chmod 600 server.key
        if [ "$(id -u)" = 0 ]; then chown postgres server.key server.pem; fi
    ) >"$DIR/tls.log" 2>&1 || {
        cat "$DIR/tls.log" >&2
        exit 1
    }
    SSL_OPTS="-c ssl=on -c ssl_cert_file=$DIR/server.pem -c ssl_key_file=$DIR/server.key"
    if [ -n "${PG_CA_OUT:-}" ]; then cp "$DIR/ca.pem" "$PG_CA_OUT"; fi
else
    echo "start-test-postgres: no openssl, so no TLS (the TLS tests will be skipped)" >&2
fi
run "$PG_BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
    -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 $SSL_OPTS" \
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
