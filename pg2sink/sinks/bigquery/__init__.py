"""The BigQuery sink (--sink=bigquery): a raw changelog table and a latest-state view per
source table in a BigQuery dataset, the DuckDB sink's model (docs/sinks/bigquery.md).

config.py   BigQueryConfig: --bigquery-project, --bigquery-dataset, --bigquery-location,
            --bigquery-endpoint, --bigquery-retry-deadline, --bigquery-load-interval
schema.py   BigQuery types and table schemas of the DuckDB sink's layouts; the view's SQL;
            which type changes BigQuery widens, and their DDL
rows.py     the DuckDB sink's Arrow rows made fit for BigQuery; unchanged TOAST read back
api.py      the client; a request's error as SinkError or SinkUnavailableError
warehouse.py  the dataset, raw tables (types widened) and views, load jobs with
            deterministic ids, the state table
sink.py     BigQuerySink: a batch per flush, one Parquet load job per table with an id
            derived from (slot, table, LSN range); acknowledged when every job is DONE

Nothing here imports google-cloud-bigquery at module level but sink.py (sinks/entries.py
imports config.py always, and the client is the optional [bigquery] extra).
"""
