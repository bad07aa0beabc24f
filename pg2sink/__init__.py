"""pg2sink: PostgreSQL change-data-capture over logical replication (pgoutput).

The public contract is the CLI and the record formats (README.md, schemas/);
everything else is internal.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
