-- The event trigger function of --capture-ddl (docs/changes.md, "DDL"): each DDL
-- statement becomes a transactional logical decoding message with prefix pg2sink.ddl,
-- so it reaches consumers in commit order, inside its transaction, as a Message record.
-- pg2sink creates the event trigger itself, only with --capture-ddl (it needs a superuser).
-- depends: 0001.import-jobs

CREATE FUNCTION capture_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
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
