# memshim — build, test, install, benchmark.
#
#   make                 build target/release/libmemshim.so and memshim-ctl
#   make test            every test CI runs (unit, integration, bench smoke)
#   make install PREFIX=/usr/local [DESTDIR=...]
#   make help            all targets

PREFIX  ?= /usr/local
DESTDIR ?=
CARGO   ?= cargo
PYTHON  ?= python3

LIB := target/release/libmemshim.so
CTL := target/release/memshim-ctl

.PHONY: all build test test-unit test-integration test-torch test-gpu lint \
        install uninstall bench bench-deps bench-smoke stress clean help

all: build

build: ## Build the release library and CLI
	$(CARGO) build --release -p memshim -p memshim-ctl

$(LIB) $(CTL): build

test: build test-unit test-integration test-torch bench-smoke ## Run every test (what CI runs)

test-unit: ## Unit tests of every crate
	$(CARGO) test --release --workspace --lib --bins

test-integration: build ## Real processes under LD_PRELOAD (tests/)
	$(CARGO) test --release -p memshim-tests --tests -- --test-threads=2

test-torch: build ## PyTorch bridge tests (fails without torch; .ci/run installs it)
	$(CARGO) test --release -p memshim-tests --test python_torch -- --ignored --test-threads=1

test-gpu: build ## GPU checks (needs an NVIDIA GPU; skips cleanly without)
	$(PYTHON) tests/gpu/check_cuda.py

lint: ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

# Docs: README.md at the top of share/doc/memshim and docs/ beside it, so the
# README's relative links resolve (and docs/README.md does not collide with it).
install: build ## Install lib/libmemshim.so, bin/memshim-ctl and the docs under $(DESTDIR)$(PREFIX)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/doc/memshim/docs
	install -m 0755 $(LIB) $(DESTDIR)$(PREFIX)/lib/libmemshim.so
	strip --strip-debug $(DESTDIR)$(PREFIX)/lib/libmemshim.so
	install -m 0755 $(CTL) $(DESTDIR)$(PREFIX)/bin/memshim-ctl
	install -m 0644 README.md $(DESTDIR)$(PREFIX)/share/doc/memshim/
	install -m 0644 docs/*.md $(DESTDIR)$(PREFIX)/share/doc/memshim/docs/

uninstall: ## Remove what `make install` installed
	rm -f $(DESTDIR)$(PREFIX)/lib/libmemshim.so $(DESTDIR)$(PREFIX)/bin/memshim-ctl
	rm -rf $(DESTDIR)$(PREFIX)/share/doc/memshim

bench-deps: ## Install the comparison allocators from Debian's packages
	bash bench/deps.sh

bench: build ## Full benchmark run; writes BENCHMARKS.md and bench/plots/
	$(PYTHON) bench/harness.py --full

bench-smoke: build ## Every benchmark scenario once, briefly (asserts it ran)
	$(PYTHON) bench/harness.py --smoke

stress: build ## Long reliability run (minutes); see docs/reliability.md
	MEMSHIM_STRESS=full $(CARGO) test --release -p memshim-tests --test stress -- --ignored --test-threads=1

clean: ## Remove build outputs
	$(CARGO) clean

help: ## List targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 20
