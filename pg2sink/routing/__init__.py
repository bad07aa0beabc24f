"""Routing and filtering between the replication stream and the sink (docs/routing.md).

- config.py   RoutingConfig: --only, --exclude-column, --mask-column, --mask-key
- rules.py    the compiled rules: which actions of a table pass, what becomes of a column
- masking.py  the masks (hash, redact, truncate:N) in Python and as SQL (imports)
- stage.py    RoutingStage: rewrites pgoutput messages in front of the changelog builder

Nothing here imports pg2sink.imports or pg2sink.subscription: the stream's handler and
the import planner both use it.
"""
