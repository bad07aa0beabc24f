-- DROP COLUMN without CASCADE on a table with a pg2sink column list (docs/routing.md,
-- "--exclude-column"; pg2sink/publication/columns.py). PostgreSQL 15 records a
-- dependency of the publication's member on each listed column, so it refuses
-- `ALTER TABLE t DROP COLUMN c` of a listed c ("cannot drop column c of table t because
-- other objects depend on it") unless CASCADE, which drops the member.
--
-- unlist_before_drop() is the function of the event trigger pg2sink creates on
-- ddl_command_start for ALTER TABLE. When the statement's text holds
-- `ALTER TABLE [IF EXISTS] [ONLY] name ... DROP ...` naming a table with a list pg2sink
-- set, that the ALTER's role may alter, it takes the table's ACCESS EXCLUSIVE lock (the
-- DROP's own lock, taken first: ALTER PUBLICATION's weaker one first, then this, would be
-- a lock upgrade, a deadlock with a transaction that wrote to the table and waits for a
-- lock on it) and takes the table out of the publication; migration 0004's
-- extend_column_lists(), at ddl_command_end of the same statement, puts it back with
-- its new list. Both run in the ALTER's transaction: no committed state has the table
-- out of the publication, and none has it published with an excluded column. A
-- statement that fails rolls both back. The names are read from current_query(): a
-- statement the text does not show (EXECUTE of a built string) still needs CASCADE.
-- depends: 0004.column-lists

DO $migration$
DECLARE
    -- the safe search_path of the function below once it has read the caller's names
    safe text := format('pg_catalog, %I, pg_temp', current_schema());
BEGIN
    EXECUTE replace($fn$
CREATE FUNCTION unlist_before_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
-- No SET search_path clause: the names in the statement must resolve under the
-- caller's search_path, as the ALTER TABLE resolves them. Until it is replaced below,
-- every type, function and operator is schema-qualified, so that no object of the
-- caller's schemas runs with this function's rights.
DECLARE
    caller pg_catalog.text := pg_catalog.current_setting('search_path');
    rels pg_catalog.oid[];
    locked pg_catalog.oid[] := '{}';
    invoker pg_catalog.text;
    r record;
BEGIN
    SELECT pg_catalog.array_agg(pg_catalog.to_regclass(m[1])::pg_catalog.oid)
    INTO rels
    FROM pg_catalog.regexp_matches(
        pg_catalog.current_query(),
        -- ALTER TABLE [IF EXISTS] [ONLY] [schema.]table [*] ..., up to the next ';'
        -- (one E'' literal continued on the next lines: backslashes whatever
        -- standard_conforming_strings says)
        E'\\malter\\s+table\\s+(?:if\\s+exists\\s+)?(?:only\\s+)?'
        '((?:"(?:[^"]|"")+"|[[:alpha:]_][[:alnum:]_$]*)'
        '(?:\\s*\\.\\s*(?:"(?:[^"]|"")+"|[[:alpha:]_][[:alnum:]_$]*))?)'
        '\\s*\\*?([^;]*)',
        'gi') AS m
    WHERE m[2] OPERATOR(pg_catalog.~*) E'\\mdrop\\M';
    IF rels IS NULL THEN
        RETURN;  -- no DROP in an ALTER TABLE of the text: nothing to do
    END IF;
    PERFORM pg_catalog.set_config('search_path', @safe@, true);
    -- the ALTER's role: SECURITY DEFINER hides it from current_user
    invoker := CASE WHEN current_setting('role') = 'none' THEN session_user::text
                    ELSE current_setting('role') END;
    FOR r IN
        SELECT DISTINCT c.oid, n.nspname, c.relname
        FROM column_lists l
        JOIN pg_class c ON c.oid = l.relid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE l.relid = ANY (rels) AND pg_has_role(invoker, c.relowner, 'USAGE')
        ORDER BY c.oid
    LOOP
        EXECUTE format('LOCK TABLE %I.%I IN ACCESS EXCLUSIVE MODE', r.nspname, r.relname);
        locked := locked || r.oid;
    END LOOP;
    -- capture_ddl (--capture-ddl) stays silent for these, as for extend_column_lists()'s
    PERFORM set_config('pg2sink.column_lists', 'on', true);
    FOR r IN
        SELECT l.publication, c.oid, n.nspname, c.relname
        FROM column_lists l
        JOIN pg_publication p ON p.pubname = l.publication
        JOIN pg_publication_rel pr ON pr.prpubid = p.oid AND pr.prrelid = l.relid
        JOIN pg_class c ON c.oid = l.relid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE l.relid = ANY (locked) AND pr.prattrs IS NOT NULL
        ORDER BY l.publication, c.oid
    LOOP
        EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I.%I',
                       r.publication, r.nspname, r.relname);
        -- for extend_column_lists(), which puts it back at the statement's end
        PERFORM set_config('pg2sink.unlisted',
                           concat_ws(',', nullif(current_setting('pg2sink.unlisted', true), ''),
                                     r.oid),
                           true);
    END LOOP;
    PERFORM set_config('pg2sink.column_lists', '', true);
    PERFORM set_config('search_path', caller, true);
END
$$
$fn$, '@safe@', quote_literal(safe));
END
$migration$;

-- migration 0004's function, whose members are also the tables unlist_before_drop()
-- took out of their publication in this statement (pg2sink.unlisted)
CREATE OR REPLACE FUNCTION extend_column_lists() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    r record;
    cols text;
    current_cols text;
BEGIN
    -- capture_ddl (--capture-ddl) skips the ALTER PUBLICATION statements run here: its
    -- consumers get the user's ALTER TABLE once, not once per statement it caused
    PERFORM set_config('pg2sink.column_lists', 'on', true);
    FOR r IN
        WITH touched AS (
            SELECT d.objid FROM pg_event_trigger_ddl_commands() d
            WHERE d.classid = 'pg_class'::regclass
            UNION
            SELECT u::oid
            FROM unnest(string_to_array(nullif(current_setting('pg2sink.unlisted', true), ''),
                                        ',')) u
        )
        SELECT DISTINCT l.publication, c.oid, n.nspname, c.relname,
               c.relreplident = 'f' AND (p.pubupdate OR p.pubdelete) AS full_identity
        FROM touched d
        JOIN column_lists l ON l.relid = d.objid
        JOIN pg_publication p ON p.pubname = l.publication
        JOIN pg_class c ON c.oid = d.objid
        JOIN pg_namespace n ON n.oid = c.relnamespace
    LOOP
        -- '' is the whole table: a list must hold every column of a FULL identity, so
        -- such a table is published whole again and pg2sink drops the excluded values
        -- on arrival (and says so at its start)
        cols := CASE WHEN r.full_identity THEN '' ELSE list_columns(r.publication, r.oid) END;
        SELECT coalesce(string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum), '')
        INTO current_cols
        FROM pg_publication p
        JOIN pg_publication_rel pr ON pr.prpubid = p.oid AND pr.prrelid = r.oid
        LEFT JOIN pg_attribute a ON a.attrelid = pr.prrelid
              AND a.attnum = ANY(pr.prattrs::int2[])
        WHERE p.pubname = r.publication
        HAVING count(pr.prrelid) > 0;
        IF r.full_identity THEN
            DELETE FROM column_lists WHERE publication = r.publication AND relid = r.oid;
        END IF;
        IF current_cols IS NOT DISTINCT FROM cols THEN
            CONTINUE;
        END IF;
        IF current_cols IS NOT NULL THEN
            EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I.%I',
                           r.publication, r.nspname, r.relname);
        END IF;
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I%s', r.publication, r.nspname,
                       r.relname, CASE WHEN cols = '' THEN '' ELSE ' (' || cols || ')' END);
    END LOOP;
    -- pg2sink.unlisted is left as it is (it ends with the transaction): another internal
    -- schema's trigger, later in this statement, may still need its tables from it
    PERFORM set_config('pg2sink.column_lists', '', true);
END
$$;

-- CREATE OR REPLACE reset the function's settings: the search_path of migration 0004
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION extend_column_lists() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END
$$;
