"""Subject names: Confluent's TopicNameStrategy, `<topic>-key` and `<topic>-value`.

Consumers' deserializers look schemas up under these names by default, so every table
written to a topic registers its versions under that topic's two subjects.
"""

from __future__ import annotations


def key_subject(topic: str) -> str:
    """The subject of the key schemas of `topic`."""
    return f"{topic}-key"


def value_subject(topic: str) -> str:
    """The subject of the value schemas of `topic`."""
    return f"{topic}-value"
