#!/usr/bin/env bash
# Single sign-on in headless Chromium through a real, certified OpenID provider: starts
# tests/oidc/provider.mjs (oidc-provider) and `sluice serve` with `[oidc]` pointing at it
# (password sign-in switched off), then runs sso.spec.mjs. Like run.sh: builds and installs
# nothing (cargo build, scripts/test-deps.sh first); TEST_STORE=sqlite|postgres.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BIN=$(realpath "${SLUICE_BIN:-target/debug/sluice}")
STORE=${TEST_STORE:-sqlite}
OUT="$ROOT/tests/ui/out-sso-$STORE"
# shellcheck source=tests/ui/lib.sh
source "$ROOT/tests/ui/lib.sh"
[ -d tests/oidc/node_modules/oidc-provider ] || { echo "run npm ci in tests/oidc (scripts/test-deps.sh)" >&2; exit 2; }
GW_PORT=$(free_port)
IDP_PORT=$(free_port)
while [ "$IDP_PORT" = "$GW_PORT" ]; do IDP_PORT=$(free_port); done
SECRET="sso-browser-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
ACCOUNTS="$WORK/accounts.json"
echo '{"alice": ["llm-admins"]}' >"$ACCOUNTS"
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

[oidc]
issuer = "http://127.0.0.1:$IDP_PORT"
client_id = "sluice"
client_secret = "\${SSO_TEST_SECRET}"
redirect_url = "http://127.0.0.1:$GW_PORT/admin/oidc/callback"
password_login = false
scopes = ["email", "groups"]
label = "Sign in with Test IdP"

[[oidc.roles]]
claim = "groups"
value = "llm-admins"
role = "admin"

[[oidc.roles]]
claim = "groups"
value = "finance"
role = "finance"
TOML

for v in $(env | grep -o '^SLUICE_[A-Z_]*' || true); do
    case "$v" in SLUICE_BIN) ;; *) unset "$v" ;; esac
done
export SSO_TEST_SECRET="$SECRET"

node tests/oidc/provider.mjs "$IDP_PORT" "http://127.0.0.1:$GW_PORT" "$ACCOUNTS" "$SECRET" >"$WORK/provider.log" 2>&1 &
PIDS+=($!)
# The provider first (node takes a second to load it): the gateway's discovery at start
# then finds it, and the test signs in through the provider, not through a retry.
for _ in $(seq 1 150); do
    curl -fsS "http://127.0.0.1:$IDP_PORT/.well-known/openid-configuration" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$IDP_PORT/.well-known/openid-configuration" >/dev/null \
    || { echo "oidc-provider did not start" >&2; cat "$WORK/provider.log" >&2; exit 1; }
"$BIN" --config "$CONFIG" migrate >/dev/null
ADMIN_PASSWORD="ui-test-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf '%s\n' "$ADMIN_PASSWORD" | "$BIN" --config "$CONFIG" admin create --username ops --role admin --password-stdin >/dev/null
"$BIN" --config "$CONFIG" serve >"$WORK/gateway.stdout.log" 2>"$WORK/gateway.stderr.log" &
PIDS+=($!)
for _ in $(seq 1 150); do
    curl -fsS "http://127.0.0.1:$GW_PORT/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$GW_PORT/healthz" >/dev/null || { echo "gateway did not start" >&2; cat "$WORK/gateway.stderr.log" >&2; exit 1; }

cd tests/ui
BASE_URL="http://127.0.0.1:$GW_PORT" IDP_URL="http://127.0.0.1:$IDP_PORT" ACCOUNTS="$ACCOUNTS" \
    ADMIN_PASSWORD="$ADMIN_PASSWORD" OUT_DIR="$OUT" \
    node --test --test-concurrency=1 sso.spec.mjs
