"""What the warehouse sinks (DuckDB, BigQuery) share; nothing here imports duckdb at run
time, so the `bigquery` extra goes without it (tests/test_packaging.py checks).

layout.py    a table's raw columns and views, evolved by each Schema record
values.py    a batch of Modifications as an Arrow table of the raw columns
toast.py     unchanged TOASTed values filled from the key's previous row
staging.py   what an import stages: its rows' layout and its Schema record as JSON
commits.py   BackgroundCommits: transactions held until their checkpoint, batched and
             committed by one background thread, retried through an outage
"""
