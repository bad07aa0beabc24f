"""Every encoder of pg2sink: records (and new rows) in, bytes out, no I/O.

pg2sink's own forms:

- jsonenc.py, jsonlines.py: the JSON of values and the JSON line of each record kind
  (the file sink's lines; NATS, Kinesis and Kafka --format json write the same);
- avro.py, avro_native.py: the Avro envelope and key of a change (Python, the reference)
  and its C encoder from pgoutput's bytes (changelog/_avro_native.c, chosen once by
  PG2SINK_IMPL, changelog/_cmodule.py);
- kafka.py, nats.py: the Kafka and NATS sinks' key and value (or payload) of every
  record kind in each of their formats (the Kinesis sink's records are its own entries,
  sinks/kinesis/payload.py, from these encoders).

The message formats of the message sinks (Kafka, NATS, Kinesis), `--format`
(docs/formats.md):

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
