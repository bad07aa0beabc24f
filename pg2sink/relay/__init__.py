"""The relay (`pg2sink relay`): pg2sink's own Kafka topics back into records, into any sink
(docs/relay.md).

config.py    RelayConfig: --from-kafka, --topics, --group-id, --from-schema-topic...
decode.py    a message's value back into records: a Modification and its table shape's
             Schema record (Avro envelope, Confluent wire format), or a JSON line's
             record; no I/O
schemas.py   where Schema records come from: the registry (Avro writer schemas by id),
             the schema topic (JSON)
relay.py     Relay: consume a batch, write it to the sink, wait until the sink holds it,
             then commit the consumer's offsets (at-least-once)

Nothing here imports confluent-kafka at module level but schemas.py and relay.py (the CLI
imports pg2sink/commands/relay.py, the command's options and its run, always, and
confluent-kafka is the optional [kafka] extra).
"""
