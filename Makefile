# The two commands the README promises: `make run` and `make test`. Everything else is a step of them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= examples/orders.yaml
TEST_PROCESSES ?= 2  # pytest-xdist processes for make test, one broker each (tests of a file stay together)

.PHONY: run test native test-python-fold console-assets chromium lint typecheck unit integration deploy-tools deploy-check broker-start broker-stop bench bench-sow bench-scan bench-apply bench-memory bench-subs bench-pipeline bench-queues bench-views bench-index bench-restore chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,spark,console]'
	touch $(STAMP)

venv: $(STAMP)

# The compiled fold (native/: Rust through PyO3), built by maturin (from PyPI, into the venv)
# with `cargo build --release` and installed into the venv as its own package; rebuilt when a
# source of native/ changes. Cargo keeps its crates in ~/.cargo/registry and its build in
# native/target (git-ignored). Without cargo nothing is built and the worker says once that it
# applies logs with the Python fold.
PATH := $(HOME)/.cargo/bin:$(PATH)
NATIVE_STAMP := $(VENV)/.native
NATIVE_SRC := native/Cargo.toml native/Cargo.lock native/pyproject.toml \
	$(wildcard native/src/*.rs) $(wildcard native/sowstream_native/*)
native: $(NATIVE_STAMP)

$(NATIVE_STAMP): $(STAMP) $(NATIVE_SRC)
	@if command -v cargo >/dev/null 2>&1; then \
	  $(BIN)/pip install --quiet 'maturin>=1.16,<2' && \
	  rm -rf native/target/wheels && \
	  $(BIN)/maturin build --release --quiet -m native/Cargo.toml -o native/target/wheels && \
	  $(BIN)/pip install --quiet --force-reinstall --no-deps native/target/wheels/*.whl && \
	  touch $@; \
	else \
	  echo "cargo not found: the compiled fold (native/) is not built; sowstream applies logs with its Python fold"; \
	fi

# Provisions Kafka from Maven Central on first use, starts it, then runs a worker in the foreground.
run: $(STAMP) native console-assets
	$(BIN)/sowstream broker start
	$(BIN)/sowstream worker --config $(CONFIG)

test: $(STAMP) native lint typecheck deploy-tools console-assets chromium
	$(BIN)/sowstream broker provision
	$(BIN)/sowstream pipeline provision
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --durations=12
	$(MAKE) test-python-fold

# The apply path's own unit tests once more with the compiled fold off: the Python fold stays
# the reference, and the fallback of a worker without the extension.
APPLY_TESTS := tests/unit/test_processor_model.py tests/unit/test_apply_fastpath.py \
	tests/unit/test_apply_pipeline.py tests/unit/test_fold.py tests/unit/test_processor_replies.py \
	tests/unit/test_memo_index.py tests/unit/test_subscription_model.py \
	tests/unit/test_subscriber_cache.py
test-python-fold: $(STAMP)
	SOWSTREAM_NATIVE=off $(BIN)/pytest -q -p no:cacheprovider $(APPLY_TESTS)

# The console page's grid and chart libraries, from npm (package-lock.json pins them), copied
# into the package's static dir (git-ignored): `sowstream console` serves them, no CDN.
CONSOLE_WEB    := sowstream/console/web
CONSOLE_VENDOR := sowstream/console/static/vendor
console-assets: $(CONSOLE_VENDOR)/.installed

$(CONSOLE_VENDOR)/.installed: $(CONSOLE_WEB)/package.json $(CONSOLE_WEB)/package-lock.json
	cd $(CONSOLE_WEB) && npm ci --no-audit --no-fund
	mkdir -p $(CONSOLE_VENDOR)
	cp $(CONSOLE_WEB)/node_modules/tabulator-tables/dist/js/tabulator.min.js \
	   $(CONSOLE_WEB)/node_modules/tabulator-tables/dist/css/tabulator.min.css \
	   $(CONSOLE_WEB)/node_modules/chart.js/dist/chart.umd.min.js $(CONSOLE_VENDOR)/
	touch $@

# The console's browser tests drive Debian's headless Chromium through its chromedriver.
chromium:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  apt-get install -y --no-install-recommends chromium chromium-driver || \
	  { apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver; }; }

unit: $(STAMP) native
	$(BIN)/pytest -q tests/unit

# Chaos runs (tests/support/chaos.py): 3 workers under mixed load while workers, the broker and
# clients are killed; RUNS=10 SECONDS=120 for the runs of docs/reliability.md.
chaos: $(STAMP)
	$(BIN)/sowstream broker provision
	$(BIN)/python -m tests.support.chaos run --runs $(or $(RUNS),1) --seconds $(or $(SECONDS),90)

integration: $(STAMP) native
	$(BIN)/pytest -q tests/integration

# kustomize (built from the Go module proxy) and Strimzi's CRDs (generated from Maven Central),
# once, into the sowstream cache; tests/deploy uses them (docs/deploy.md).
deploy-tools: $(STAMP)
	$(BIN)/python -m tests.deploy.tools

# Only the offline checks of deploy/: kustomize build, schemas, hadolint.
deploy-check: deploy-tools
	$(BIN)/pytest -q -p no:cacheprovider tests/deploy

lint: $(STAMP)
	$(BIN)/ruff check sowstream tests bench
	$(BIN)/ruff format --check sowstream tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

broker-start: $(STAMP)
	$(BIN)/sowstream broker start

broker-stop: $(STAMP)
	$(BIN)/sowstream broker stop

# Every row of issue 13's table in one run, with ratios and aims (10-15 minutes).
bench: $(STAMP) native
	$(BIN)/python -m bench.perf

bench-sow: $(STAMP) native
	$(BIN)/python -m bench.sow_bench

# The full-scan sow alone, repeated (about half a minute).
bench-scan: $(STAMP) native
	$(BIN)/python -m bench.scan_bench

# The per-record apply path in process, step by step (no broker; about a minute).
bench-apply: $(STAMP) native
	$(BIN)/python -m bench.apply_profile

# 10M updates over 1M keys, worker RSS sampled (about 10 minutes).
bench-memory: $(STAMP)
	$(BIN)/python -m bench.memory_bench

bench-subs: $(STAMP)
	$(BIN)/python -m bench.subs_bench

bench-pipeline: $(STAMP)
	$(BIN)/python -m bench.pipeline_bench

bench-queues: $(STAMP)
	$(BIN)/python -m bench.queue_bench

bench-views: $(STAMP)
	$(BIN)/python -m bench.view_bench

bench-index: $(STAMP)
	$(BIN)/python -m bench.index_bench --records 100000

# KEYS=200000 for a quick run
bench-restore: $(STAMP)
	$(BIN)/python -m bench.restore_bench --keys $(or $(KEYS),1000000)

clean:
	rm -rf $(VENV) .sowstream build *.egg-info native/target
