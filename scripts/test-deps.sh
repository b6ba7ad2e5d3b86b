#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine with the Rust toolchain:
# the Python SDKs the compatibility tests drive. Idempotent and quick when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c "import openai, anthropic, pytest" >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt
fi
