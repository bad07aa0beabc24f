"""Message formats of the message sinks (Kafka, NATS, Kinesis): `--format` (docs/formats.md).

Each format is a pure encoder, record in, bytes out, no I/O:

- base.py: the Encoder and TableEncoder protocols, a table's columns from its Schema record,
  the text of a value;
- json.py: pg2sink's own JSON (the file sink's line, without the newline);
- pg_kinesis.py, wal_listener.py, psql_streamer.py: the message shapes of the seed tools,
  so that their consumers keep working;
- debezium.py (with debezium_types.py): Debezium's change event envelope, with or
  without its Kafka Connect schema;
- registry.py: the formats by name;
- config.py: the one `--format` option (FormatConfig) and what the CLI hands the sinks
  (Formatting: the choice, and the source's host and database).
"""
