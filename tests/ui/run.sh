#!/usr/bin/env bash
# The admin UI in headless Chromium. Starts `sluice mock` and `sluice serve` as processes on
# free ports with a fresh database (like tests/sdk/conftest.py), creates the first admin with
# `sluice admin create --password-stdin`, then runs admin.spec.mjs (node's test runner,
# playwright-core driving Debian's /usr/bin/chromium). Builds and installs nothing: run
# `cargo build` and scripts/test-deps.sh first. Screenshots land in tests/ui/out/; with
# SLUICE_UPDATE_SCREENSHOTS=1 the README's three are copied to docs/screenshots/.
# The database is a SQLite file, or with TEST_STORE=postgres (the api suite's variable) one
# on a throwaway PostgreSQL server (scripts/pg-scratch.sh), the master key in a 0600
# `[database] key_file`; its screenshots and logs go to tests/ui/out-postgres/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BIN=$(realpath "${SLUICE_BIN:-target/debug/sluice}")
STORE=${TEST_STORE:-sqlite}
OUT="$ROOT/tests/ui/out"
[ "$STORE" = sqlite ] || OUT="$ROOT/tests/ui/out-$STORE"
# shellcheck source=tests/ui/lib.sh
source "$ROOT/tests/ui/lib.sh"
GW_PORT=$(free_port)
MOCK_PORT=$(free_port)
while [ "$MOCK_PORT" = "$GW_PORT" ]; do MOCK_PORT=$(free_port); done
CONFIG="$WORK/sluice.toml"
cat > "$CONFIG" <<TOML
[server]
listen = "127.0.0.1:$GW_PORT"
public_url = "http://127.0.0.1:$GW_PORT"
workers = 2

[database]
$DATABASE

[backup]
dir = "$WORK/backup"

[upstream]
# The keys page adds an upstream on the mock, on loopback.
managed_allow_private_network = true

[[upstreams]]
id = "mock-a"
provider = "openai"
base_url = "http://127.0.0.1:$MOCK_PORT/v1"
api_key = "sk-upstream-ui-canary-7Q2x"
allow_private_network = true

[[models]]
name = "gpt-4o-mini"
routes = [{ upstream = "mock-a", model = "gpt-4o-mini" }]
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60

[[models]]
name = "text-embedding-3-small"
routes = [{ upstream = "mock-a", model = "text-embedding-3-small" }]
input_usd_per_mtok = 0.02
output_usd_per_mtok = 0
TOML

# Only the config file decides (no stray SLUICE_* overrides from the caller).
for v in $(env | grep -o '^SLUICE_[A-Z_]*' || true); do
    case "$v" in SLUICE_BIN|SLUICE_UPDATE_SCREENSHOTS) ;; *) unset "$v" ;; esac
done

"$BIN" mock --listen "127.0.0.1:$MOCK_PORT" >"$WORK/mock.log" 2>&1 &
PIDS+=($!)
"$BIN" --config "$CONFIG" migrate >/dev/null
if [ "$STORE" = postgres ]; then
    # The run is on the engine it says: the tables are in PostgreSQL, no SQLite file.
    [ "$(psql "$PG_SCRATCH_URL" -tAc "SELECT count(*) FROM information_schema.tables WHERE table_name = 'tokens'")" = 1 ] ||
        { echo "no tokens table on $PG_SCRATCH_URL" >&2; exit 1; }
    [ ! -e "$WORK/sluice.db" ] || { echo "$WORK/sluice.db exists on TEST_STORE=postgres" >&2; exit 1; }
fi
ADMIN_PASSWORD="ui-test-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf '%s\n' "$ADMIN_PASSWORD" | "$BIN" --config "$CONFIG" admin create --username admin --role admin --password-stdin >/dev/null
"$BIN" --config "$CONFIG" serve >"$WORK/gateway.stdout.log" 2>"$WORK/gateway.stderr.log" &
PIDS+=($!)

for _ in $(seq 1 150); do
    curl -fsS "http://127.0.0.1:$GW_PORT/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$GW_PORT/healthz" >/dev/null || { echo "gateway did not start" >&2; cat "$WORK/gateway.stderr.log" >&2; exit 1; }
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$MOCK_PORT/_mock/stats" >/dev/null 2>&1 && break
    sleep 0.1
done

cd tests/ui
BASE_URL="http://127.0.0.1:$GW_PORT" MOCK_URL="http://127.0.0.1:$MOCK_PORT" ADMIN_PASSWORD="$ADMIN_PASSWORD" OUT_DIR="$OUT" SLUICE_BIN="$BIN" SLUICE_CONFIG_FILE="$CONFIG" \
    node --test --test-concurrency=1 admin.spec.mjs keys.spec.mjs && status=0 || status=$?
if [ "$status" -eq 0 ] && [ "${SLUICE_UPDATE_SCREENSHOTS:-}" = "1" ]; then
    mkdir -p "$ROOT/docs/screenshots"
    cp "$OUT/dashboard.png" "$OUT/tokens.png" "$OUT/reports.png" "$ROOT/docs/screenshots/"
fi
exit $status
