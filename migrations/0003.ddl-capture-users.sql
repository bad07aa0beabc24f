-- The users of the --capture-ddl event trigger (pg2sink/imports/migrate.py,
-- set_capture_ddl): one row per replication slot whose pg2sink was started with
-- --capture-ddl. Event triggers are per database, so several pg2sink instances (slots)
-- of one database share the trigger: it exists while this table has a row. A start
-- without --capture-ddl removes only its own slot's row, `pg2sink drop` its slot's row,
-- and whoever removes the last row drops the trigger, in the same transaction and under
-- a lock on this table, so a concurrent registration never loses it.
-- depends: 0002.capture-ddl

CREATE TABLE ddl_capture_users (
    slot_name text PRIMARY KEY,
    publication text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);
