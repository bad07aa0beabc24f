-- Import jobs and their partitions (docs/imports.md).
-- Applied by `pg2sink migrate` and at the start of `pg2sink stream`, with the
-- search_path set to the internal schema (--internal-schema, default pg2sink):
-- names here are unqualified on purpose, so the schema name stays configurable.
-- depends:

CREATE TABLE import_jobs (
    id bigserial PRIMARY KEY,
    publication text NOT NULL,
    schema_name text NOT NULL,
    table_name text NOT NULL,
    -- why it exists: 'join' (the table joined the publication) or 'request' (pg2sink import)
    reason text NOT NULL DEFAULT 'join',
    -- pending -> running -> done; running -> failed (retried at next_attempt_at) -> running;
    -- any live state -> expired (replaced by a newer job, or the table left the publication)
    state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'running', 'done', 'failed', 'expired')),
    -- the current attempt's exported snapshot: name, xmin:xmax:xip, WAL position and time
    snapshot_name text,
    snapshot pg_snapshot,
    snapshot_lsn pg_lsn,
    snapshot_time timestamptz,
    rows_estimated bigint,
    rows_processed bigint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    error text,
    error_count integer NOT NULL DEFAULT 0,
    last_error_at timestamptz,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    completed_at timestamptz,
    expired_at timestamptz
);

-- At most one live job per table and publication.
CREATE UNIQUE INDEX import_jobs_live ON import_jobs (publication, schema_name, table_name)
    WHERE state IN ('pending', 'running', 'failed');

CREATE INDEX import_jobs_due ON import_jobs (next_attempt_at)
    WHERE state IN ('pending', 'running', 'failed');

-- The partitions fixed when a job is first planned: one predicate each. A partition
-- is marked done only after its rows are durable in the sink, so a resumed job skips it.
CREATE TABLE import_partitions (
    job_id bigint NOT NULL REFERENCES import_jobs (id) ON DELETE CASCADE,
    partition integer NOT NULL,
    predicate text NOT NULL,
    done boolean NOT NULL DEFAULT false,
    rows bigint,
    -- which attempt wrote it (import_jobs.attempts at the time), for resume checks
    attempt integer,
    done_at timestamptz,
    PRIMARY KEY (job_id, partition)
);
