# memshim — build, test, install, benchmark.
#
#   make                 build target/release/libmemshim.so, libmemshim_bridge.so and memshim-ctl
#   make test            install what the tests need (scripts/test-deps.sh), then
#                        every test CI runs (unit, integration, wheel, bench smoke)
#   make wheel           target/wheels/memshim-<version>-py3-none-manylinux_2_{17,34}_<arch>.whl
#   make install PREFIX=/usr/local [DESTDIR=...]
#   make help            all targets

PREFIX  ?= /usr/local
DESTDIR ?=
CARGO   ?= cargo
PYTHON  ?= python3

LIB := target/release/libmemshim.so
BRIDGE := target/release/libmemshim_bridge.so
CTL := target/release/memshim-ctl

# Wheels: built with zig as the C compiler and linker (cargo-zigbuild), against
# glibc 2.17's symbol versions, whatever glibc this machine has. The tools
# live in their own venv under .tools/ (pip's cache keeps re-creating it fast;
# `make clean` keeps it). docs/deploy.md, "pip", says why zig.
# Two wheels per architecture: manylinux_2_17 (every glibc from 2.17), and
# manylinux_2_34, whose libraries are linked against glibc 2.34 (they name no
# libpthread.so.0 or libdl.so.2, which every exec would otherwise open: docs/
# design.md, "Portability"); pip takes the 2_34 one wherever glibc is 2.34 or
# newer. Its memshim-ctl is the 2.17 build's. The 2.34 libraries are built in
# a target directory of their own, since cargo's directory for a target does
# not tell glibc floors apart.
TOOLS        := .tools/venv
TOOL_PINS    := ziglang==0.17.1 cargo-zigbuild==0.24.0 auditwheel==6.8.2
empty        :=
ZIGBUILD     := $(TOOLS)/.installed-$(subst ==,-,$(subst $(empty) $(empty),_,$(TOOL_PINS)))
GLIBC_FLOOR  := 2.17
GLIBC_STUBLESS := 2.34
STUBLESS_DIR := target/glibc$(GLIBC_STUBLESS)
WHEEL_DIR    ?= target/wheels
HOST_ARCH    := $(shell uname -m)
WHEEL_ENV     = PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" CARGO_PROFILE_RELEASE_DEBUG=false \
                CARGO_PROFILE_RELEASE_STRIP=debuginfo

.PHONY: all build test test-deps test-unit test-integration test-torch test-shipped test-vm test-gpu lint \
        install uninstall bench bench-deps bench-smoke stress clean help \
        wheel wheels wheel-x86_64 wheel-aarch64 test-aarch64 tools

all: build

build: ## Build the release library and CLI
	$(CARGO) build --release -p memshim -p memshim-bridge -p memshim-ctl

$(LIB) $(BRIDGE) $(CTL): build

test: test-deps ## Install what the tests need, then run every test (what CI runs)
	$(MAKE) build
	@# Both architectures in one cargo run; the aarch64 wheel goes to scratch,
	@# so that target/wheels/ holds only wheels this machine can install.
	@if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then \
	    $(MAKE) wheels WHEEL_DIR=target/test-scratch/wheels && $(MAKE) wheel-x86_64; \
	else echo "SKIP aarch64 wheel: rustup has no aarch64-unknown-linux-gnu standard library and could not fetch it"; \
	    $(MAKE) wheel-x86_64; fi
	$(MAKE) test-unit test-integration test-torch bench-smoke test-shipped

test-deps: ## Install what the tests need and this machine lacks (idempotent; scripts/test-deps.sh)
	bash scripts/test-deps.sh

test-unit: ## Unit tests of every crate
	$(CARGO) test --release --workspace --lib --bins

# One test binary per family, tests/tests/<family>/ (docs/design.md, "The
# tests"); each runs its modules' tests two at a time. cgroup_vm runs the
# cgroup family again inside QEMU VMs on live cgroup v2.
TEST_FAMILIES = core control cgroup python deploy stress cgroup_vm

test-integration: build ## Real processes under LD_PRELOAD (tests/), family by family
	$(CARGO) test --release -p memshim-tests $(TEST_FAMILIES:%=--test %) --no-fail-fast -- --test-threads=2

# The families whose outcome depends on how the library was built, again
# with the wheels' libraries and CLI (what pip users preload: zig, glibc 2.17
# and 2.34; docs/design.md, "Portability"): profiling, sampling under CPython, numpy
# and torch, the interposed symbols and errno, the Python bridge's reach,
# and the exec-cost smoke. Each test binary names the build it runs.
# Both wheels' libraries (2.17 and 2.34) run them, each with the 2.17 CLI,
# which is copied beside the 2.34 libraries as the 2_34 wheel packs it:
# memshim-ctl loads the bridge (attach) from beside its own real path.
SHIPPED_DIR  := target/$(HOST_ARCH)-unknown-linux-gnu/release
SHIPPED_LIBS := $(SHIPPED_DIR) $(STUBLESS_DIR)/$(HOST_ARCH)-unknown-linux-gnu/release
test-shipped: wheel-$(HOST_ARCH) ## The build-dependent families against the wheels' libraries (make test runs them)
	@set -e; for d in $(SHIPPED_LIBS); do \
	    [ "$$d" = "$(SHIPPED_DIR)" ] || install -m 0755 $(SHIPPED_DIR)/memshim-ctl $$d/memshim-ctl; \
	    echo "== test-shipped: a wheel's build, $$d: libmemshim.so, libmemshim_bridge.so and the 2.17 memshim-ctl"; \
	    export MEMSHIM_TEST_LIB=$(CURDIR)/$$d/libmemshim.so MEMSHIM_TEST_CTL=$(CURDIR)/$$d/memshim-ctl; \
	    $(CARGO) test --release -p memshim-tests --test core --no-fail-fast -- --test-threads=2 \
	        interpose:: compat::free_keeps_errno forks::a_fork_costs forks::a_single_threaded_fork; \
	    $(CARGO) test --release -p memshim-tests --test control --no-fail-fast -- --test-threads=2 profile:: profile_files::; \
	    $(CARGO) test --release -p memshim-tests --test python --no-fail-fast -- --test-threads=2 \
	        profile:: sampling:: reach:: attach:: torch::a_heap_profile; \
	done
	$(PYTHON) bench/harness.py --smoke --only s6 --configs glibc,memshim,memshim-wheel,memshim-wheel217,mimalloc \
	    --out target/test-scratch/bench-shipped

test-vm: build ## The cgroup tests on live cgroup v2, in QEMU VMs (make test runs them too; tests/vm/README.md)
	bash scripts/vm-image.sh
	$(CARGO) test --release -p memshim-tests --tests --no-run
	$(CARGO) test --release -p memshim-tests --test cgroup_vm

test-torch: build ## PyTorch bridge tests (fails without torch; make test-deps installs it)
	$(CARGO) test --release -p memshim-tests --test python -- torch:: --ignored --test-threads=1

test-gpu: build ## GPU checks (needs an NVIDIA GPU; skips cleanly without)
	$(PYTHON) tests/gpu/check_cuda.py

lint: ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

# Docs: README.md at the top of share/doc/memshim and docs/ beside it, so the
# README's relative links resolve (and docs/README.md does not collide with it).
install: build ## Install lib/libmemshim.so, lib/libmemshim_bridge.so, bin/memshim-ctl and the docs under $(DESTDIR)$(PREFIX)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/doc/memshim/docs
	install -m 0755 $(LIB) $(DESTDIR)$(PREFIX)/lib/libmemshim.so
	strip --strip-debug $(DESTDIR)$(PREFIX)/lib/libmemshim.so
	install -m 0755 $(BRIDGE) $(DESTDIR)$(PREFIX)/lib/libmemshim_bridge.so
	strip --strip-debug $(DESTDIR)$(PREFIX)/lib/libmemshim_bridge.so
	install -m 0755 $(CTL) $(DESTDIR)$(PREFIX)/bin/memshim-ctl
	install -m 0644 README.md $(DESTDIR)$(PREFIX)/share/doc/memshim/
	install -m 0644 docs/*.md $(DESTDIR)$(PREFIX)/share/doc/memshim/docs/

uninstall: ## Remove what `make install` installed
	rm -f $(DESTDIR)$(PREFIX)/lib/libmemshim.so $(DESTDIR)$(PREFIX)/lib/libmemshim_bridge.so $(DESTDIR)$(PREFIX)/bin/memshim-ctl
	rm -rf $(DESTDIR)$(PREFIX)/share/doc/memshim

bench-deps: ## Install the comparison allocators from Debian's packages
	bash bench/deps.sh

bench: build ## Full benchmark run; writes BENCHMARKS.md and bench/plots/
	$(PYTHON) bench/harness.py --full

bench-smoke: build ## Every benchmark scenario once, briefly (asserts it ran)
	$(PYTHON) bench/harness.py --smoke

stress: build ## Long reliability run (minutes); see docs/reliability.md
	MEMSHIM_STRESS=full $(CARGO) test --release -p memshim-tests --test stress -- --ignored --test-threads=1

tools: $(ZIGBUILD) ## The wheel build's tools (zig, cargo-zigbuild, auditwheel) in .tools/venv

$(ZIGBUILD):
	@$(PYTHON) -m venv --clear $(TOOLS) || { echo "make: python3 -m venv failed; on Debian: apt-get install python3-venv" >&2; exit 1; }
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check $(TOOL_PINS)
	touch $@

wheel: wheel-$(HOST_ARCH) ## The two wheels for this machine's architecture (target/wheels/)

# One cargo run for both targets: they share the host-side build (proc
# macros, build scripts) and keep both cores busy while one target links.
wheels: $(ZIGBUILD) ## The x86_64 and aarch64 wheels (two each), built together
	$(call zigbuild,x86_64 aarch64)
	$(call pack,x86_64)
	$(call pack,aarch64)

wheel-x86_64 wheel-aarch64: wheel-%: $(ZIGBUILD)
	$(call zigbuild,$*)
	$(call pack,$*)

# $(call zigbuild,ARCHS): for each ARCH, the release libraries and CLI against
# glibc $(GLIBC_FLOOR), and the libraries again against glibc $(GLIBC_STUBLESS)
# in $(STUBLESS_DIR), without debug info (the wheels are what users download).
zigbuild = @for a in $(1); do rustup target list --installed 2>/dev/null | grep -qx "$$a-unknown-linux-gnu" \
	        || rustup target add "$$a-unknown-linux-gnu" || exit 1; done; \
	$(WHEEL_ENV) $(CARGO) zigbuild --release -p memshim -p memshim-bridge -p memshim-ctl \
	    $(foreach a,$(1),--target $(a)-unknown-linux-gnu.$(GLIBC_FLOOR)) && \
	$(WHEEL_ENV) $(CARGO) zigbuild --release -p memshim -p memshim-bridge --target-dir $(STUBLESS_DIR) \
	    $(foreach a,$(1),--target $(a)-unknown-linux-gnu.$(GLIBC_STUBLESS))

# $(call pack,ARCH): both wheels, each checked by auditwheel for its platform
# tag. WHEEL_DIR=dir puts them elsewhere than target/wheels/.
pack = $(call pack1,$(1),$(GLIBC_FLOOR),target/$(1)-unknown-linux-gnu/release) && \
	$(call pack1,$(1),$(GLIBC_STUBLESS),$(STUBLESS_DIR)/$(1)-unknown-linux-gnu/release)
# $(call pack1,ARCH,GLIBC,LIBDIR): one wheel, its libraries from LIBDIR. The
# wheel auditwheel reads is the one build_wheel.py names on its output
# ("PATH (N MiB)"), so wheels of other versions in WHEEL_DIR do not matter.
pack1 = w=$$($(TOOLS)/bin/python python/build_wheel.py --arch $(1) --glibc $(2) --lib-dir $(3) \
	    --bin-dir target/$(1)-unknown-linux-gnu/release --out $(WHEEL_DIR)) && echo "$$w" && \
	w=$${w%% (*} && \
	$(TOOLS)/bin/auditwheel show "$$w" | tr '\n' ' ' \
	    | grep -q 'consistent with the following platform tag: "manylinux_$(subst .,_,$(2))_$(1)"' \
	    || { $(TOOLS)/bin/auditwheel show "$$w"; exit 1; }

test-aarch64: $(ZIGBUILD) ## The aarch64 smoke test under qemu-user alone (make test runs it too)
	$(CARGO) test --release -p memshim-tests --test deploy -- aarch64:: --test-threads=1

clean: ## Remove build outputs
	$(CARGO) clean

help: ## List targets
	@grep -E '^[a-z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 20
