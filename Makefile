# The two commands of the README: `make run` (the gateway on its embedded defaults, with
# an offline demo upstream) and `make test` (every test).

.PHONY: run test test-deps bench bench-litellm

# Test threads per binary. The api tests wait on sockets, timers and child processes far
# more than they compute (a CI run kept ~0.65 of its 2 cores busy at the default of one
# thread per core): 4 threads on 2 cores ran the api suite in 6.3 min where 2 took 10.7
# under the same load, every test passing; at 8 the timing of the busiest tests frays.
# The load tests run one at a time whatever this is (`tests/load/rig.rs`).
# `scripts/test-postgres-pass.sh` reads it too.
export TEST_THREADS ?= 4

run:
	cargo run --release --locked -- serve --demo

test-deps:
	./scripts/test-deps.sh

test: test-deps
	./scripts/module-cycles.py
	cargo build --locked
	cargo test --locked --no-fail-fast -- --test-threads=$(TEST_THREADS)
	./scripts/dev-features.py
	./scripts/test-postgres-pass.sh
	SLUICE_BIN=target/debug/sluice ./tests/sdk/run.sh
	TEST_STORE=postgres SLUICE_BIN=target/debug/sluice ./tests/sdk/run.sh
	SLUICE_BIN=target/debug/sluice ./tests/ui/run.sh
	TEST_STORE=postgres SLUICE_BIN=target/debug/sluice ./tests/ui/run.sh
	SLUICE_BIN=target/debug/sluice ./tests/ui/sso.sh
	TEST_STORE=postgres SLUICE_BIN=target/debug/sluice ./tests/ui/sso.sh

bench:
	cargo build --release --locked --bins --examples
	python3 bench/overhead.py
	python3 bench/scenarios.py
	./target/release/examples/quota_cas
	./target/release/examples/cache_lookup
	./target/release/examples/count_tokens

# Sluice and a pinned LiteLLM proxy side by side (bench/README.md); not part of `make
# test` or `make bench`. The first run installs LiteLLM from PyPI into target/litellm-venv.
bench-litellm:
	cargo build --release --locked --bins --examples
	python3 bench/litellm.py
