# mlxbar: `make run` serves the default model, `make test` runs every test.
# Both install what is missing first (scripts/setup.sh; Debian 12 or macOS).
SHELL := /bin/bash
CARGO ?= cargo
PORT ?= 8080

.PHONY: setup build run serve test bench fetch-model doctor check-macos clean

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release

fetch-model: build
	./target/release/mlxbar fetch-model

run: serve

serve: build
	./target/release/mlxbar serve --port $(PORT)

doctor: build
	./target/release/mlxbar doctor

# Everything CI runs: unit + integration tests on the real engine and default model, then a
# type-check of the macOS code for Apple Silicon.
test: setup
	bash scripts/test.sh

check-macos: setup
	bash scripts/check-macos.sh

# Side-by-side with peer servers (installs them; llama.cpp builds from source, ~17 min).
bench: build
	bash scripts/bench.sh

clean:
	$(CARGO) clean
