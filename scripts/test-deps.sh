#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine with the Rust toolchain:
# a redis-server for the rate-limit tests, a PostgreSQL server for the multi-host store, libfaketime for the skewed-clock tests, the Python SDKs the compatibility tests drive (and opentelemetry-proto for the traces test),
# and for the admin UI test Debian's chromium plus playwright-core (npm ci in tests/ui; the
# browser is never downloaded by Playwright). Idempotent, and quick when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=""
apt_install() {
    if [ -z "$apt_updated" ]; then
        $sudo apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# Redis: `redis-server` for the window tests, also run as `redis-server --cluster-enabled
# yes` (Redis Cluster) and `redis-server --sentinel` (no extra package); `redis-cli` (Debian's
# redis-tools) joins the cluster (`--cluster create`, Redis 5 or newer) and inspects keys.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    apt_install redis-server redis-tools
    # The tests start their own servers on free ports; the distribution's service is not needed.
    $sudo systemctl disable --now redis-server >/dev/null 2>&1 || true
fi

# PostgreSQL (issue 17): the tests run `initdb` and `postgres` themselves on free ports (as
# the `postgres` user when run as root: PostgreSQL refuses root), never the distribution's
# service (tests/api/pg_server.rs; scripts/pg-scratch.sh for the SDK and browser suites).
# `psql` creates each test's database.
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || ! command -v psql >/dev/null 2>&1; then
    apt_install postgresql postgresql-client
    $sudo systemctl disable --now postgresql >/dev/null 2>&1 || true
fi

# libfaketime moves a gateway process's clock in tests/api/clocks.rs (Q12, R3).
if [ ! -e /usr/bin/faketime ]; then
    apt_install faketime
fi

# strace shows the key file's folder fsynced at the first start (tests/api/files.rs).
if ! command -v strace >/dev/null 2>&1; then
    apt_install strace
fi

if ! python3 -c "import openai, agents, anthropic, pytest, opentelemetry.proto" >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt
fi

if ! command -v curl >/dev/null 2>&1; then
    apt_install curl
fi
if [ ! -x /usr/bin/chromium ]; then
    apt_install chromium
fi
if ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
fi
if [ ! -d tests/ui/node_modules/playwright-core ]; then
    (cd tests/ui && npm ci --no-audit --no-fund --loglevel=error)
fi
# oidc-provider, the OpenID provider of the single sign-on browser test (tests/ui/sso.sh).
if [ ! -d tests/oidc/node_modules/oidc-provider ]; then
    (cd tests/oidc && npm ci --no-audit --no-fund --loglevel=error)
fi
# Codex CLI for tests/sdk/test_api_responses_codex.py: its binary ships inside the package.
if [ ! -x tests/sdk/codex/node_modules/.bin/codex ]; then
    (cd tests/sdk/codex && npm ci --no-audit --no-fund --loglevel=error)
fi
