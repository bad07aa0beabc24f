"""Snapshot imports: jobs in the internal schema, exported snapshots, the stream's gate.

migrate (yoyo migrations of the internal schema), jobs (the job store), snapshot (the
exported snapshot and its visibility test), gate (holds the stream while an import
runs), engine (the job loop), plan and spark (the Spark runner; spark_daemon, its local
workers' daemon). docs/imports.md has the model and why it converges.
"""
