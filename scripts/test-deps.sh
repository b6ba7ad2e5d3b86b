#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine with the Rust toolchain:
# a redis-server for the rate-limit tests, and the Python SDKs the compatibility tests
# drive. Idempotent, and quick when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
    # The tests start their own servers on free ports; the distribution's service is not needed.
    $sudo systemctl disable --now redis-server >/dev/null 2>&1 || true
fi

if ! python3 -c "import openai, anthropic, pytest" >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt
fi
