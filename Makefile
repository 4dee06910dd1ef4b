# Quick start: `make demo` trains the toy translation Transformer, `make test` runs the tests.
# Each target installs missing Debian packages, configures, builds with both cores and runs.
BUILD ?= build
JOBS ?= 2
DEPS = cmake g++ make ccache pkg-config libdnnl-dev libboost-test-dev libsentencepiece-dev \
       nlohmann-json3-dev libcli11-dev libcairo2-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps configure build test demo bench clean

deps:
	@missing=""; for p in $(DEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; fi

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: configure
	cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && OMP_NUM_THREADS=$(JOBS) ctest --output-on-failure -j1

# The demo builds only what it runs (the translate program), to stay within its time budget.
demo: configure
	cmake --build $(BUILD) -j$(JOBS) --target translate
	OMP_NUM_THREADS=$(JOBS) ./examples/translation/demo.sh $(BUILD)

bench: build
	./bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD)
