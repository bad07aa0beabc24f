"""The relay (`pg2sink relay`): pg2sink's own Kafka topics back into records, into any sink
(docs/relay.md).

config.py    RelayConfig: --from-kafka, --topics, --group-id, --relay-kafka-config
decode.py    a message's value back into a Modification (Avro envelope, Confluent wire
             format) and a table shape's Schema record; no I/O
schemas.py   the writer schemas of the consumed messages, by id, from the registry
relay.py     Relay: consume a batch, write it to the sink, wait until the sink holds it,
             then commit the consumer's offsets (at-least-once)
command.py   the `relay` command's options and its run

Nothing here imports confluent-kafka at module level but schemas.py and relay.py (the CLI
imports command.py always, and confluent-kafka is the optional [kafka] extra).
"""
