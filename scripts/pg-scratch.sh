#!/usr/bin/env bash
# A throwaway PostgreSQL server for the SDK and browser suites (TEST_STORE=postgres), the
# shell twin of tests/api/pg_server.rs:
#
#   pg_env=$(scripts/pg-scratch.sh start $$)   # fails the caller's set -e if it fails
#   eval "$pg_env"                             # sets PG_SCRATCH_DIR and PG_SCRATCH_URL
#   ...                                     # the gateway's [database] url = $PG_SCRATCH_URL
#   scripts/pg-scratch.sh stop "$PG_SCRATCH_DIR"
#
# `start` runs `initdb` into a new folder under $TMPDIR and `postgres` (through pg_ctl) on a
# free port of 127.0.0.1, with fsync off (test data is thrown away), creates the database
# `sluice` with psql, and prints the two shell assignments. PostgreSQL refuses to run as
# root, and CI runs as root: then the server runs as the `postgres` user (Debian's package
# creates it), its folder owned by that user. A `start` that fails removes what it made.
# `stop` ends the server (immediate shutdown: nothing to keep) and removes the folder.
# The folder's name holds the owner's pid (the argument of `start`, else the parent's): a
# folder whose owner is gone (a run killed before its trap ran) has its server stopped and
# is removed by the next `start`.
# The binaries: `pg_ctl` on PATH, else Debian's newest /usr/lib/postgresql/<v>/bin.
set -euo pipefail

bin_dir() {
    local d
    if command -v pg_config >/dev/null 2>&1; then
        d=$(pg_config --bindir 2>/dev/null || true)
        if [ -n "$d" ] && [ -x "$d/postgres" ]; then
            echo "$d"
            return 0
        fi
    fi
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5n | tail -n 1)
    if [ -n "$d" ] && [ -x "$d/postgres" ]; then
        echo "$d"
        return 0
    fi
    echo "PostgreSQL is not installed (scripts/test-deps.sh installs Debian's postgresql)" >&2
    exit 2
}

# Runs a PostgreSQL binary, as the `postgres` user when we are root.
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        id postgres >/dev/null 2>&1 || {
            echo "running as root needs the \`postgres\` user (Debian's postgresql package creates it)" >&2
            exit 2
        }
        HOME=/tmp runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

stop_dir() {
    local dir=$1 bin
    [ -d "$dir" ] || return 0
    bin=$(bin_dir)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
}

remove_stale() {
    local base=$1 dir pid
    for dir in "$base"/sluice-pgscratch-*; do
        [ -d "$dir" ] || continue
        pid=${dir##*/sluice-pgscratch-}
        pid=${pid%%-*}
        case "$pid" in '' | *[!0-9]*) continue ;; esac
        [ -e "/proc/$pid" ] || stop_dir "$dir"
    done
}

start() {
    local owner=$1 base=${TMPDIR:-/tmp} bin port attempt
    bin=$(bin_dir)
    remove_stale "$base"
    dir=$(mktemp -d "$base/sluice-pgscratch-$owner-XXXXXX")
    # Until the end, an exit (a failure under set -e) removes the folder and a server that
    # got as far as starting.
    trap 'stop_dir "$dir"' EXIT
    chmod 0755 "$dir"
    [ "$(id -u)" -ne 0 ] || chown postgres:postgres "$dir"
    as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync --locale C >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        false
    }
    # A free port can be taken between the probe and the bind: try a few.
    for attempt in 1 2 3; do
        port=$(free_port)
        if as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 -s \
            -o "-p $port -k '$dir' -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=32MB -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
            start >/dev/null 2>&1; then
            break
        fi
        [ "$attempt" -lt 3 ] || {
            echo "postgres did not start:" >&2
            cat "$dir/postgres.log" >&2
            false
        }
    done
    psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qc "CREATE DATABASE sluice" >/dev/null
    trap - EXIT
    printf 'PG_SCRATCH_DIR=%q\nPG_SCRATCH_URL=%q\n' "$dir" "postgres://postgres@127.0.0.1:$port/sluice"
}

case "${1:-}" in
start)
    owner=${2:-$PPID}
    case "$owner" in '' | *[!0-9]*) echo "usage: $0 start [OWNER_PID]" >&2; exit 2 ;; esac
    start "$owner"
    ;;
stop)
    [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }
    case "$2" in */sluice-pgscratch-*) stop_dir "$2" ;; *) echo "not a scratch folder: $2" >&2; exit 2 ;; esac
    ;;
*)
    echo "usage: $0 start [OWNER_PID] | stop DIR" >&2
    exit 2
    ;;
esac
