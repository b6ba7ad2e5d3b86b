#!/usr/bin/env bash
# The api suite again with every app's database on PostgreSQL (`TEST_STORE=postgres`, see
# tests/api/helpers.rs), less the SQLite-only tests listed in tests/api/sqlite_only.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
skips=()
while read -r filter; do
    skips+=(--skip "$filter")
done < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tests/api/sqlite_only.txt | grep -v '^$')
TEST_STORE=postgres exec cargo test --locked --no-fail-fast --test api -- \
    --test-threads="${TEST_THREADS:-4}" "${skips[@]}"
