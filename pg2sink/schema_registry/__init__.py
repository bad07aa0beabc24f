"""Schema registry: the client that registers Avro schemas, subject naming, wire format.

SchemaRegistry        the Protocol a sink needs: register(subject, schema) -> id
RegistryClient        its implementation over the Confluent-compatible REST API
key_subject, value_subject   TopicNameStrategy subject names
wire_header           the Confluent wire-format prefix of a message
"""

from __future__ import annotations

from pg2sink.schema_registry.client import RegistryClient, SchemaRegistry
from pg2sink.schema_registry.subjects import key_subject, value_subject
from pg2sink.schema_registry.wire import wire_header

__all__ = ["RegistryClient", "SchemaRegistry", "key_subject", "value_subject", "wire_header"]
