"""The Amazon Kinesis sink (--sink=kinesis): one Kinesis record per pg2sink record.

    config.py    KinesisConfig: its options
    payload.py   records → (partition key, data): the JSON line, keyed by primary key
    batching.py  PutRecords' limits, batches and what a response says to send again
                 (pure functions over entries and response dicts)
    sender.py    the background thread: one PutRecords at a time, in order, retried
    sink.py      KinesisSink: the client, the stream check, acknowledgements
    imports.py   the import writer: executors put an import's rows themselves

Only config.py is imported without --sink=kinesis (the sink registry reads it):
boto3 is the [kinesis] extra.
"""
