"""The DuckDB sink (--sink=duckdb): an embedded warehouse file, a raw changelog table and
a latest-state view per source table (docs/sinks/duckdb.md).

config.py   DuckDBConfig: --duckdb-path
layout.py   a table's raw columns and DuckDB types, the names, the DDL and the view's SQL
values.py   Modifications -> an Arrow table of the raw table's columns
toast.py    unchanged TOASTed values filled from the key's previous row
missing.py  ADD COLUMN ... DEFAULT: the value old rows read, as DuckDB text for the view
sink.py     DuckDBSink: batches committed with the acknowledged LSN in one transaction,
            staged import files loaded first; a large transaction written in chunks
transaction.py  what one DuckDB transaction writes: DDL, rows, staged import files
imports.py  DuckDBImportTarget: executors stage an import's rows as Parquet files

Nothing here imports duckdb at module level but sink.py (sinks/entries.py imports config.py
always, and duckdb is the optional [duckdb] extra).
"""
