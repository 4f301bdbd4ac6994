# Tidelog developer commands. `make test` and `make run` build .venv from nothing first.
#   make test    lint + type check + generated-code check + the whole test suite
#   make run     the broker with its embedded defaults (127.0.0.1:7410, ./tidelog-data)
#   make check   ruff, mypy and the protobuf check only
#   make bench   the benchmarks (see README for each one's figures)
#   make bench-peers  Tidelog against NATS JetStream and Redis Streams (docs/benchmarks.md);
#                installs the bench extra, and nats-server/redis-server with apt-get as root

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: all venv check lint format typecheck proto proto-check test run bench bench-peers clean

all: test

ZOOKEEPER_JAR := /usr/share/java/zookeeper.jar

$(STAMP): pyproject.toml
	@# Cluster tests run a throwaway ZooKeeper from Debian's package on the machine's Java.
	@if [ ! -f $(ZOOKEEPER_JAR) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends libzookeeper-java >/dev/null) \
	      || echo "libzookeeper-java could not be installed: the cluster tests will say so"; \
	  else echo "no $(ZOOKEEPER_JAR): install libzookeeper-java for the cluster tests"; fi; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# compat: a path entry for the project root, not an import hook, so that PySpark's
	# pkgutil.iter_modules() finds pyspark_tidelog (format("tidelog")) from any directory.
	$(BIN)/python -m pip install --quiet -e '.[spark,test,dev]' --config-settings editable_mode=compat
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python -m proto.generate

proto-check: $(STAMP)
	$(BIN)/python -m proto.generate --check

check: lint typecheck proto-check

test: check
	$(BIN)/python -m pytest $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/python -m broker

bench: $(STAMP)
	$(BIN)/python benchmarks/storage_bench.py
	$(BIN)/python benchmarks/broker_bench.py
	$(BIN)/python benchmarks/client_bench.py
	$(BIN)/python benchmarks/codec_bench.py
	$(BIN)/python benchmarks/latency_stages.py

BENCH_ARGS ?=
bench-peers: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
