"""The Kafka sink (--sink=kafka): Avro with a schema registry, or JSON.

    config.py   KafkaConfig: its options
    sink.py     KafkaSink: producing, delivery reports, failures
    producer.py the producer's settings (what the guarantees need), librdkafka's log
    topic_check.py  whether a topic exists (or is created) before its first message
    acks.py     which checkpoints are durable (acknowledged by draining the producer)
    health.py   whether Kafka is reachable: evidence, hysteresis, one log line per change
    formats.py  message keys and values (Avro wire format or JSON) per table
    topics.py   table → topic routing (injective default names)
    imports.py  the import writer: executors produce an import's rows themselves
    make.py     which sink --sink=kafka makes (with --exactly-once)
    transactional.py  --exactly-once: flushes as Kafka transactions, resent changes skipped
    offsets.py  --exactly-once's offsets topic: each transaction's checkpoint
    txtopic.py  --transaction-topic: BEGIN and END records (sinks/txmeta.py), a part
                of either sink

Only config.py is imported without --sink=kafka (the sink registry reads it):
confluent-kafka and fastavro are the [kafka] extra.
"""
