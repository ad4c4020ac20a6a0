# The two commands the README promises: `make run` and `make test`. Everything else is a step of them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= examples/orders.yaml
TEST_PROCESSES ?= 2  # pytest-xdist processes for make test, one broker each (tests of a file stay together)

.PHONY: run test console-assets chromium lint typecheck unit integration deploy-tools deploy-check broker-start broker-stop bench bench-sow bench-scan bench-apply bench-memory bench-subs bench-pipeline bench-queues bench-views bench-index bench-restore chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,spark,console]'
	touch $(STAMP)

venv: $(STAMP)

# Provisions Kafka from Maven Central on first use, starts it, then runs a worker in the foreground.
run: $(STAMP) console-assets
	$(BIN)/sowstream broker start
	$(BIN)/sowstream worker --config $(CONFIG)

test: $(STAMP) lint typecheck deploy-tools console-assets chromium
	$(BIN)/sowstream broker provision
	$(BIN)/sowstream pipeline provision
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_PROCESSES) --dist loadfile

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

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

# Chaos runs (tests/support/chaos.py): 3 workers under mixed load while workers, the broker and
# clients are killed; RUNS=10 SECONDS=120 for the runs of docs/reliability.md.
chaos: $(STAMP)
	$(BIN)/sowstream broker provision
	$(BIN)/python -m tests.support.chaos run --runs $(or $(RUNS),1) --seconds $(or $(SECONDS),90)

integration: $(STAMP)
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
bench: $(STAMP)
	$(BIN)/python -m bench.perf

bench-sow: $(STAMP)
	$(BIN)/python -m bench.sow_bench

# The full-scan sow alone, repeated (about half a minute).
bench-scan: $(STAMP)
	$(BIN)/python -m bench.scan_bench

# The per-record apply path in process, step by step (no broker; about a minute).
bench-apply: $(STAMP)
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
	rm -rf $(VENV) .sowstream build *.egg-info
