.PHONY: demo test lint fmt build

## The local end-to-end run: installs what it needs, starts moto (or uses AWS_ENDPOINT_URL) and the provider simulator.
demo:
	bash infra/scripts/demo.sh

## The whole test suite, with its own emulator and simulator.
test:
	bash infra/scripts/test.sh

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all

build:
	cargo build --workspace
