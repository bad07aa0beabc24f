#!/usr/bin/env bash
# `make demo`: a throwaway PostgreSQL with logical replication, two pg2sinks on their
# own slots (the DuckDB sink and the file sink), a few inserts/updates/deletes, the
# records the file sink wrote and DuckDB's latest-state view; then everything is
# stopped and removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

work=$(mktemp -d /tmp/pg2sink-demo.XXXXXX)
chmod 755 "$work"
pid=""
duck_pid=""
stop() {  # stop a pg2sink (SIGTERM: it flushes, confirms and exits 0)
  [ -n "$1" ] && kill "$1" 2>/dev/null && wait "$1" 2>/dev/null || true
}
cleanup() {
  stop "$pid"
  stop "$duck_pid"
  $PY scripts/services.py stop --dir "$work" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# wait_streaming PID LOG: until the pg2sink of PID logs that it streams
wait_streaming() {
  for _ in $(seq 1 100); do
    grep -q "pg2sink is streaming" "$2" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || { cat "$2"; exit 1; }
    sleep 0.1
  done
}

echo "== starting a throwaway PostgreSQL (wal_level=logical)"
$PY scripts/services.py start postgres --dir "$work" | sed 's/^/   /'
# shellcheck disable=SC1091
. "$work/env"

psql -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE public.customers (id serial PRIMARY KEY, name text NOT NULL, balance numeric(10,2),
                               tags text[], updated_at timestamptz DEFAULT now());
SQL

# The DuckDB sink's pg2sink starts while the table is empty (so --no-imports loses
# nothing and no second Spark starts), on a slot and publication of its own; it runs
# beside the file sink's and streams the same changes.
echo "== starting: pg2sink --sink=duckdb --duckdb-path=$work/shop.duckdb --slot=demo_duckdb"
$PY -m pg2sink --sink=duckdb --duckdb-path="$work/shop.duckdb" --slot=demo_duckdb \
  --publication=demo_duckdb --no-imports --metrics-address=off --flush-interval=200ms \
  --log-level=info 2>"$work/duckdb.log" &
duck_pid=$!
wait_streaming "$duck_pid" "$work/duckdb.log"
grep -E 'slot|streaming' "$work/duckdb.log" | sed 's/^/   log: /'

psql -q -v ON_ERROR_STOP=1 <<'SQL'
-- a row from before the file sink's pg2sink starts: its snapshot import (Spark) writes it
-- as IMPORT (the DuckDB sink's pg2sink streams it as an INSERT)
INSERT INTO public.customers (name, balance, tags) VALUES ('Edsger', 42.00, '{founder}');
SQL

echo "== starting: pg2sink --sink=file --file-path=$work/changes.jsonl"
$PY -m pg2sink --sink=file --file-path="$work/changes.jsonl" --flush-interval=200ms \
  --log-level=info 2>"$work/pg2sink.log" &
pid=$!
wait_streaming "$pid" "$work/pg2sink.log"
sed 's/^/   log: /' "$work/pg2sink.log"

echo "== changing data"
psql -q -v ON_ERROR_STOP=1 -e <<'SQL'
INSERT INTO customers (name, balance, tags) VALUES ('Ada', 120.50, '{vip}'), ('Grace', 99.99, NULL);
UPDATE customers SET balance = balance + 10 WHERE name = 'Ada';
DELETE FROM customers WHERE name = 'Grace';
SQL

# Everything is in the file once the import is done and the DELETE (the last change) is
# there: the changes the import's snapshot does not see wait for its rows, then go in
# commit order. Spark starts in seconds.
for _ in $(seq 1 900); do
  live=$(psql -Atc "SELECT count(*) FROM pg2sink.import_jobs WHERE state <> 'done'")
  [ "$live" = 0 ] && grep -q '"operation":"DELETE"' "$work/changes.jsonl" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/pg2sink.log"; exit 1; }
  sleep 0.1
done
grep -q '"operation":"DELETE"' "$work/changes.jsonl" 2>/dev/null \
  || { echo "demo: the DELETE never reached the file"; cat "$work/pg2sink.log"; exit 1; }

echo "== records written by pg2sink ($work/changes.jsonl)"
$PY - "$work/changes.jsonl" <<'PYEOF'
import decimal, json, sys
for line in open(sys.argv[1]):
    r = json.loads(line, parse_float=decimal.Decimal)
    if r["kind"] == "schema":
        fields = ", ".join(f'{f["name"]}:{f["type"][1]["pg.type"]}' for f in r["schema"]["fields"])
        print(f'schema       {r["namespace"]}.{r["name"]} ({fields})')
    else:
        print(f'modification {r["operation"]:<6} seq={r["sequence"]} lsn={r["lsn"]} '
              f'before={json.dumps(r["before"], default=str)} after={json.dumps(r["after"], default=str)}')
PYEOF
echo "== raw JSON line of the first modification"
grep -m1 '"kind":"modification"' "$work/changes.jsonl"

kill -TERM "$pid"; wait "$pid" || true; pid=""
echo "== pg2sink stopped cleanly; slot position:"
psql -Atc "SELECT slot_name || ' confirmed_flush_lsn=' || confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'pg2sink'"

# The DuckDB sink confirms an LSN once its DuckDB transaction committed: past the
# DELETE's position, the file holds every change.
delete_lsn=$(grep '"operation":"DELETE"' "$work/changes.jsonl" | $PY -c 'import json, sys; n = json.loads(sys.stdin.readline())["lsn"]; print(f"{n >> 32:X}/{n & 0xFFFFFFFF:X}")')
for _ in $(seq 1 300); do
  done_=$(psql -Atc "SELECT confirmed_flush_lsn > '$delete_lsn' FROM pg_replication_slots WHERE slot_name = 'demo_duckdb'")
  [ "$done_" = t ] && break
  kill -0 "$duck_pid" 2>/dev/null || { cat "$work/duckdb.log"; exit 1; }
  sleep 0.1
done
[ "$done_" = t ] || { echo "demo: the DuckDB sink never confirmed the DELETE"; cat "$work/duckdb.log"; exit 1; }
# DuckDB allows one process per file: stop pg2sink before reading it
kill -TERM "$duck_pid"; wait "$duck_pid" || true; duck_pid=""
echo "== DuckDB ($work/shop.duckdb): the raw changelog table public_customers_raw"
$PY - "$work/shop.duckdb" <<'PYEOF'
import sys
import duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
con.sql("SELECT _pg2sink_position AS position, _pg2sink_operation AS operation, "
        "coalesce(id, _pg2sink_before_id) AS id, name, balance, tags "
        "FROM public_customers_raw ORDER BY _pg2sink_position").show()
print("== the latest-state view public_customers: what SELECT * FROM customers gives")
con.sql("SELECT id, name, balance, tags FROM public_customers ORDER BY id").show()
PYEOF
echo "== in PostgreSQL"
psql -c "SELECT id, name, balance, tags FROM customers ORDER BY id"
echo "== done (PostgreSQL stopped and removed)"
