-- Publication column lists for --exclude-column (docs/routing.md, "--exclude-column";
-- pg2sink/publication/columns.py): the excluded values then never leave the server.
-- column_exclusions holds each publication's --exclude-column patterns as PostgreSQL
-- regular expressions (anchored; the CLI rewrites them at every start); column_lists
-- the members whose column list pg2sink set (a list set by hand is left alone).
-- extend_column_lists() is the function of the event trigger pg2sink creates on
-- ddl_command_end for ALTER TABLE: in the ALTER's own transaction it sets each such
-- member's list to the table's columns minus the excluded ones, so a column added is
-- published from the next change on, and a table a DROP COLUMN ... CASCADE took out of
-- the publication is back in it before the transaction commits.
-- depends: 0003.ddl-capture-users

CREATE TABLE column_exclusions (
    publication text NOT NULL,
    -- NULL: the pattern names no schema (any schema)
    schema_re text,
    table_re text NOT NULL,
    column_re text NOT NULL
);

CREATE INDEX column_exclusions_publication ON column_exclusions (publication);

CREATE TABLE column_lists (
    publication text NOT NULL,
    relid oid NOT NULL,
    PRIMARY KEY (publication, relid)
);

CREATE FUNCTION list_columns(pub text, rel oid) RETURNS text
LANGUAGE sql STABLE AS $$
    -- the quoted column list that pub's exclusions leave of rel (generated columns are
    -- never in a PostgreSQL 15 list: pgoutput does not send them)
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE c.oid = rel AND a.attgenerated = ''
      AND NOT EXISTS (
          SELECT 1 FROM column_exclusions e
          WHERE e.publication = pub
            AND (e.schema_re IS NULL OR n.nspname ~ e.schema_re)
            AND c.relname ~ e.table_re AND a.attname ~ e.column_re)
$$;

CREATE FUNCTION extend_column_lists() RETURNS event_trigger
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
        SELECT DISTINCT l.publication, c.oid, n.nspname, c.relname,
               c.relreplident = 'f' AND (p.pubupdate OR p.pubdelete) AS full_identity
        FROM pg_event_trigger_ddl_commands() d
        JOIN column_lists l ON l.relid = d.objid
        JOIN pg_publication p ON p.pubname = l.publication
        JOIN pg_class c ON c.oid = d.objid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE d.classid = 'pg_class'::regclass
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
    PERFORM set_config('pg2sink.column_lists', '', true);
END
$$;

-- migration 0002's function, but silent while extend_column_lists() runs
CREATE OR REPLACE FUNCTION capture_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF current_setting('pg2sink.column_lists', true) = 'on' THEN
        RETURN;
    END IF;
    PERFORM pg_logical_emit_message(
        true,
        'pg2sink.ddl',
        json_build_object('tag', tg_tag, 'query', current_query())::text
    );
    -- No EXCEPTION block: it would run the message in a subtransaction, and the
    -- decoder then orders it after the transaction's later changes. SECURITY DEFINER
    -- (owned by the superuser who installed it) lets every role's DDL emit it.
END
$$;

-- SECURITY DEFINER: a search_path naming this schema (whatever --internal-schema is),
-- pg_temp last so no temporary table can stand in for the two above
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION extend_column_lists() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION list_columns(text, oid) SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END
$$;
