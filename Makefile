# The two commands of the README: `make run` (the gateway on its embedded defaults, with
# an offline demo upstream) and `make test` (every test).

.PHONY: run test test-deps bench

run:
	cargo run --release --locked -- serve --demo

test-deps:
	./scripts/test-deps.sh

test: test-deps
	./scripts/module-cycles.py
	cargo build --locked
	cargo test --locked --no-fail-fast
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
