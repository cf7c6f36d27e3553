# mlxbar: `make run` starts the menu-bar app (or, without a desktop, the headless server)
# with the default model; `make test` runs every test.
# Both install what is missing first (scripts/setup.sh; Debian 12 or macOS).
SHELL := /bin/bash
CARGO ?= cargo
PORT ?= 8080

.PHONY: setup build run app serve test bench fetch-model doctor check-macos icons clean

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace --bins

fetch-model: build
	./target/release/mlxbar fetch-model

# The menu-bar app where a desktop session exists (always on macOS), else the server.
run: build
	@if [ "$$(uname -s)" = Darwin ] || [ -n "$${DISPLAY:-}$${WAYLAND_DISPLAY:-}" ]; then \
	  echo "starting the menu-bar app (server on http://127.0.0.1:$(PORT)); make serve for the headless server"; \
	  ./target/release/mlxbar-app --port $(PORT); \
	else \
	  echo "no desktop session (DISPLAY/WAYLAND_DISPLAY unset): starting the headless server"; \
	  ./target/release/mlxbar serve --port $(PORT); \
	fi

app: build
	./target/release/mlxbar-app --port $(PORT)

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

# Redraws the tray and app icons (committed PNGs) with ImageMagick.
icons:
	bash scripts/make-icons.sh

clean:
	$(CARGO) clean
