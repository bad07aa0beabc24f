#!/usr/bin/env bash
# `make demo`: a throwaway PostgreSQL with logical replication, pg2sink with
# the file sink, a few inserts/updates/deletes, the records it wrote; then
# everything is stopped and removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

work=$(mktemp -d /tmp/pg2sink-demo.XXXXXX)
chmod 755 "$work"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  $PY scripts/services.py stop --dir "$work" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting a throwaway PostgreSQL (wal_level=logical)"
$PY scripts/services.py start postgres --dir "$work" | sed 's/^/   /'
# shellcheck disable=SC1091
. "$work/env"

psql -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE public.customers (id serial PRIMARY KEY, name text NOT NULL, balance numeric(10,2),
                               tags text[], updated_at timestamptz DEFAULT now());
-- a row from before pg2sink starts: its snapshot import (Spark) writes it as IMPORT
INSERT INTO public.customers (name, balance, tags) VALUES ('Edsger', 42.00, '{founder}');
SQL

echo "== starting: pg2sink --sink=file --file-path=$work/changes.jsonl"
$PY -m pg2sink --sink=file --file-path="$work/changes.jsonl" --flush-interval=200ms \
  --log-level=info 2>"$work/pg2sink.log" &
pid=$!
for _ in $(seq 1 100); do
  grep -q "pg2sink is streaming" "$work/pg2sink.log" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/pg2sink.log"; exit 1; }
  sleep 0.1
done
sed 's/^/   log: /' "$work/pg2sink.log"

echo "== changing data"
psql -q -v ON_ERROR_STOP=1 -e <<'SQL'
INSERT INTO customers (name, balance, tags) VALUES ('Ada', 120.50, '{vip}'), ('Grace', 99.99, NULL);
UPDATE customers SET balance = balance + 10 WHERE name = 'Ada';
DELETE FROM customers WHERE name = 'Grace';
SQL

# 1 IMPORT + 4 changes; the changes wait for the import (Spark starts in seconds)
for _ in $(seq 1 600); do
  n=$(grep -c '"kind":"modification"' "$work/changes.jsonl" 2>/dev/null || true)
  [ "${n:-0}" -ge 5 ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/pg2sink.log"; exit 1; }
  sleep 0.1
done
[ "${n:-0}" -ge 5 ] || { echo "demo: expected 5 modifications, got ${n:-0}"; cat "$work/pg2sink.log"; exit 1; }

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
psql -Atc "SELECT slot_name || ' confirmed_flush_lsn=' || confirmed_flush_lsn FROM pg_replication_slots"
echo "== done (PostgreSQL stopped and removed)"
