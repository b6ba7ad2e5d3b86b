# Sourced by run.sh and sso.sh (after `cd` to the repository and setting ROOT, BIN and
# OUT): checks what they need, makes the scratch folder WORK (PIDS started there are
# stopped, their logs kept in OUT, at exit), and sets DATABASE — a SQLite file, or with
# TEST_STORE=postgres (the api suite's variable) one on a throwaway PostgreSQL server
# (scripts/pg-scratch.sh), the master key in a 0600 `[database] key_file`.
[ -x "$BIN" ] || { echo "sluice binary not found at $BIN; run cargo build" >&2; exit 2; }
[ -x /usr/bin/chromium ] || { echo "/usr/bin/chromium missing; run scripts/test-deps.sh" >&2; exit 2; }
[ -d tests/ui/node_modules/playwright-core ] || { echo "run npm ci in tests/ui (scripts/test-deps.sh)" >&2; exit 2; }

case "$STORE" in sqlite | postgres) ;; *) echo "TEST_STORE=$STORE: expected sqlite or postgres" >&2; exit 2 ;; esac
rm -rf "$OUT" && mkdir -p "$OUT"
WORK=$(mktemp -d)
PIDS=()
PG_SCRATCH_DIR=""
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    cp "$WORK"/*.log "$OUT"/ 2>/dev/null || true
    rm -rf "$WORK"
    [ -z "$PG_SCRATCH_DIR" ] || "$ROOT/scripts/pg-scratch.sh" stop "$PG_SCRATCH_DIR"
}
trap cleanup EXIT
# A signal ends the run through `exit`, so the EXIT trap runs (bash skips it when killed).
trap 'exit 130' INT
trap 'exit 143' TERM HUP

if [ "$STORE" = postgres ]; then
    # Assigned first, so a failed start stops the run (an eval of a failed $(…) would not).
    pg_env=$("$ROOT/scripts/pg-scratch.sh" start $$)
    eval "$pg_env"
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/master.key")
    DATABASE="url = \"$PG_SCRATCH_URL\"
key_file = \"$WORK/master.key\""
else
    DATABASE="url = \"sqlite://$WORK/sluice.db\""
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
