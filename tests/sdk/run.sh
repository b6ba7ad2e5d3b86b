#!/usr/bin/env bash
# Run the OpenAI SDK compatibility suite against target/debug/sluice (or $SLUICE_BIN).
# Installs and builds nothing: run `cargo build` first, and have `openai` and `pytest`
# installed (pip install openai pytest). With TEST_STORE=postgres the gateway's database is
# on a throwaway PostgreSQL server (scripts/pg-scratch.sh; see conftest.py).
set -u
cd "$(dirname "$0")/../.." || exit 2
exec python3 -m pytest -q -p no:cacheprovider tests/sdk "$@"
