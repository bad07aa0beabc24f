"""The NATS JetStream sink (--sink=nats; docs/sinks/nats.md).

config.py    NatsConfig: --nats-url, --nats-subject-prefix, --nats-stream, credentials, TLS
context.py   --nats-config: a nats CLI context file's URL, credentials and TLS files
subjects.py  subjects of tables, Schema records and messages; Nats-Msg-Id of each message
payload.py   the bytes of each record kind (the JSON line; later formats plug in here)
client.py    Publisher: the nats-py connection on an event loop thread, acks counted
sink.py      NatsSink: records to messages on the delivery engine's Outbox (batches,
             checkpoints acknowledged in order, failures, replays: sinks/delivery)
imports.py   the import target: executors publish an import's rows and await the acks

Only config.py (with context.py) is imported with the package (the registry's need): the
others import nats-py, the optional [nats] extra.
"""
