# Tidelog developer commands. `make test` and `make run` build .venv from nothing first.
#   make test    lint + type check + generated-code check + the whole test suite
#   make run     the broker with its embedded defaults (127.0.0.1:7410, ./tidelog-data),
#                plus the Kafka protocol listener on 127.0.0.1:9092
#   make cluster ZooKeeper and BROKERS (3) brokers on 127.0.0.1 in the foreground, kept in
#                DATA_DIR (./tidelog-cluster): `tidelog cluster up` (BASE_PORT, default 7400)
#   make console the web console on http://127.0.0.1:7480/ for the broker of `make run`
#                (CONSOLE_ARGS="--bootstrap HOST:PORT,... --listen HOST:PORT" to change)
#   make check   ruff, mypy and the protobuf check only
#   make native  rebuild the optional C extensions (storage._native, client.cdc._pgnative)
#                in place after an edit
#                (pip install -e builds it too; without a C compiler both go on without it)
#   make asan    the codec's fuzz and differential tests against an AddressSanitizer build
#   make test-pure  the codec's tests with TIDELOG_PURE_PYTHON=1 (part of make test)
#   make test-extended  the tests `make test` leaves out (marked extended: longer and repeated
#                variants of tests CI runs in a shorter form; docs/testing.md)
#   make bench   the benchmarks (see README for each one's figures)
#   make bench-peers  Tidelog against NATS JetStream and Redis Streams (docs/benchmarks.md);
#                installs the bench extra, and nats-server/redis-server with apt-get as root
#   make bench-limits  the Kafka listener against the machine's limits (issue #31,
#                docs/performance.md); installs iperf3 and redis-server with apt-get as root

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: all venv cluster console native asan test-pure test-extended check lint format typecheck proto proto-check test run bench bench-peers bench-limits faults kafka-python-suite clean

all: test

ZOOKEEPER_JAR := /usr/share/java/zookeeper.jar

$(STAMP): pyproject.toml setup.py
	@# Cluster tests run a throwaway ZooKeeper from Debian's package on the machine's Java.
	@if [ ! -f $(ZOOKEEPER_JAR) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends libzookeeper-java >/dev/null) \
	      || echo "libzookeeper-java could not be installed: the cluster tests will say so"; \
	  else echo "no $(ZOOKEEPER_JAR): install libzookeeper-java for the cluster tests"; fi; \
	fi
	@# The web console's browser tests drive Debian's chromium (Playwright, no download).
	@if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null) \
	      || echo "chromium could not be installed: the console's browser tests will say so"; \
	  else echo "no chromium: install it for the console's browser tests"; fi; \
	fi
	@# The Kafka listener's tests (tests/kafka) drive Debian's kcat (librdkafka 2.0.2).
	@if ! command -v kcat >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends kcat >/dev/null) \
	      || echo "kcat could not be installed: the Kafka listener tests will say so"; \
	  else echo "no kcat: install Debian's kcat for the Kafka listener tests"; fi; \
	fi
	@# The network-partition tests (tests/faults) cut brokers off in network namespaces with nft.
	@if ! command -v nft >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends nftables >/dev/null) \
	      || echo "nftables could not be installed: the network-partition tests will say so"; \
	  else echo "no nft: install Debian's nftables for the network-partition tests"; fi; \
	fi
	@# The slow-link tests (tests/faults/test_delayer.py) need iptables' NFQUEUE target.
	@if ! command -v iptables >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends iptables >/dev/null) \
	      || echo "iptables could not be installed: the slow-link tests will say so"; \
	  else echo "no iptables: install Debian's iptables for the slow-link tests"; fi; \
	fi
	@# The lost-unsynced-writes tests (tests/faults/test_lossyfs.py) mount FUSE with fuse3.
	@if ! command -v fusermount3 >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends fuse3 >/dev/null) \
	      || echo "fuse3 could not be installed: the lost-unsynced-writes tests will say so"; \
	  else echo "no fusermount3: install Debian's fuse3 for the lost-unsynced-writes tests"; fi; \
	fi
	@# The CDC tests (tests/cdc) run Debian's PostgreSQL 15 (initdb, postgres) as the postgres user.
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql >/dev/null) \
	      || echo "postgresql could not be installed: the CDC tests will say so"; \
	  else echo "no PostgreSQL: install Debian's postgresql for the CDC tests"; fi; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The plain editable install users type: pyproject.toml's package-dir makes it a path
	# entry for the project root, not an import hook, so PySpark's pkgutil.iter_modules()
	# finds pyspark_tidelog (format("tidelog")) from any directory.
	$(BIN)/python -m pip install --quiet -e '.[spark,test,dev,console,cdc]'
	touch $(STAMP)

venv: $(STAMP) native

# Rebuilt when the source is newer than the built module. `optional` as in setup.py: a
# failed build warns and leaves the pure-Python codec in charge.
NATIVE_SO = $(firstword $(wildcard storage/_native*.so) storage/_native.so)
CDC_NATIVE_SO = $(firstword $(wildcard client/cdc/_pgnative*.so) client/cdc/_pgnative.so)
native: $(NATIVE_SO) $(CDC_NATIVE_SO)
# build_ext rebuilds only the extensions whose sources changed; the touch marks a module
# it found up to date (e.g. after an edit of setup.py) as such for make too.
$(NATIVE_SO): storage/_native.c setup.py $(STAMP)
	$(BIN)/python setup.py --quiet build_ext --inplace || echo "storage._native not built: the pure-Python codec runs"
	@if [ -f $@ ]; then touch $@; fi
$(CDC_NATIVE_SO): client/cdc/_pgnative.c setup.py $(STAMP)
	$(BIN)/python setup.py --quiet build_ext --inplace || echo "client.cdc._pgnative not built: the pure-Python CDC path runs"
	@if [ -f $@ ]; then touch $@; fi

# AddressSanitizer: a copy of the tree with the extension built -fsanitize=address, and
# the codec tests (differential, fuzz, corrupt batches) run against it. PYTHONMALLOC=malloc
# puts every object (the bytes the decoder reads included) in its own malloc block, so a
# read one byte past one is caught, not hidden in a pymalloc arena. Leak checking is off:
# CPython's own allocations at exit would drown the report.
ASAN_DIR := build/asan
ASAN_TESTS ?= tests/storage/test_native.py tests/storage/test_records.py tests/storage/test_codecs.py \
	tests/client/test_partitioner.py tests/cdc/test_pgnative.py
# The whole checkout is copied (symbolic links kept: tidelog/ links to the layers), so that
# `tidelog.storage._native` and `tidelog.client.cdc._pgnative` resolve to the sanitized
# builds here, ahead of the editable install's; the check after the build says which
# files were loaded, and fails if either is the normal build.
asan: $(STAMP)
	rm -rf $(ASAN_DIR) && mkdir -p $(ASAN_DIR)
	git ls-files -z | xargs -0 cp -P --parents -t $(ASAN_DIR)
	cd $(ASAN_DIR) && CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g -O1" \
		LDFLAGS="-fsanitize=address" ../../$(BIN)/python setup.py --quiet build_ext --inplace
	cd $(ASAN_DIR) && PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" \
		PYTHONPATH=. ../../$(BIN)/python -c "import os, tidelog.storage._native as a, \
		tidelog.client.cdc._pgnative as b; here = os.getcwd(); \
		[print('asan build:', m.__file__) for m in (a, b)]; \
		assert all(os.path.realpath(m.__file__).startswith(here) for m in (a, b)), 'not the ASan build'"
	cd $(ASAN_DIR) && PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" \
		TIDELOG_FUZZ_EXAMPLES=$${TIDELOG_FUZZ_EXAMPLES:-2000} PYTHONPATH=. \
		../../$(BIN)/python -m pytest -p no:cacheprovider -q $(ASAN_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python -m tidelog.proto.generate

proto-check: $(STAMP)
	$(BIN)/python -m tidelog.proto.generate --check

check: lint typecheck proto-check

test: check native
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(MAKE) test-pure

# The codec's tests again with the C extension switched off: the fallback a machine
# without a compiler runs (the rest of the suite is codec-agnostic).
PURE_TESTS := tests/storage/test_records.py tests/storage/test_native.py tests/storage/test_codecs.py \
	tests/client/test_fetcher.py tests/client/test_fetcher_txn.py tests/client/test_partitioner.py \
	tests/spark/test_arrow_columns.py
# The cases `make test` deselects (pytest's -m 'not extended' in pyproject.toml): more
# bootstrap positions, kill variants and fault runs of tests it runs once, the fuzz
# test's full run and the longer soak. Outside CI (docs/testing.md lists them).
test-extended: $(STAMP)
	$(BIN)/python -m pytest -m extended $(PYTEST_ARGS)

test-pure: $(STAMP)
	TIDELOG_PURE_PYTHON=1 $(BIN)/python -m pytest -q $(PURE_TESTS)

run: $(STAMP)
	$(BIN)/python -m tidelog.broker --set kafka.listen=127.0.0.1:9092

# Needs Debian's ZooKeeper on Java 17; said plainly rather than failing inside the command.
cluster: $(STAMP)
	@if [ ! -f $(ZOOKEEPER_JAR) ] || ! command -v java >/dev/null; then \
	  echo "make cluster needs ZooKeeper: $(ZOOKEEPER_JAR) (Debian's libzookeeper-java) and java."; \
	  echo "Install it with: sudo apt-get install libzookeeper-java"; exit 1; \
	fi
	$(BIN)/tidelog cluster up --brokers $(or $(BROKERS),3) --data-dir $(or $(DATA_DIR),tidelog-cluster) \
		--base-port $(or $(BASE_PORT),7400)

CONSOLE_ARGS ?= --bootstrap 127.0.0.1:7410 --listen 127.0.0.1:7480
console: $(STAMP)
	$(BIN)/tidelog console $(CONSOLE_ARGS)

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

# Loopback (iperf3), disk, an asyncio echo, and the Kafka listener in one run; Redis
# Streams for the 100 B ratios. `make bench-limits BENCH_ARGS=--quick`.
LIMITS_ARGS ?= --peers redis
bench-limits: $(STAMP)
	@if ! command -v iperf3 >/dev/null || ! command -v redis-server >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends iperf3 redis-server >/dev/null) \
	      || echo "iperf3/redis-server could not be installed: the benchmark says what it used"; \
	  else echo "no iperf3 or redis-server: the benchmark falls back (socketpair, no ratios)"; fi; \
	fi
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/limits_bench.py $(LIMITS_ARGS) $(BENCH_ARGS)


# kafka-python's own integration suite against a broker's Kafka listener (fetched with pip
# at run time; not CI: docs/kafka.md says what fails and why). `make kafka-python-suite`.
kafka-python-suite: $(STAMP)
	$(BIN)/python -m tests.kafka.client_suite $(SUITE_ARGS)

# The long fault run (issue #29, docs/reliability.md; needs root): DURATION seconds of a
# seeded schedule of partitions, pauses, kills and power losses against three brokers,
# then the history checker. `make faults DURATION=1800 SEED=7` (WORKLOADS=queue,append,txn
# adds the transactional workload).
faults: $(STAMP)
	$(BIN)/python -m tests.faults.run --duration $(or $(DURATION),1800) $(if $(SEED),--seed $(SEED)) --brokers $(or $(BROKERS),3) $(if $(WORKLOADS),--workloads $(WORKLOADS)) --lossy --out $(or $(OUT),faults-out/$(or $(SEED),latest))

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info storage/_native*.so client/cdc/_pgnative*.so
