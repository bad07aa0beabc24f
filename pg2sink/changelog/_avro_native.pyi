"""Type stubs of the C extension _avro_native.c (see avro_native.py)."""

from collections.abc import Sequence
from datetime import datetime

from pg2sink.changelog.records import Operation

class RowEncoder:
    def __init__(
        self,
        columns: Sequence[tuple[int, int, int, int, bytes]],
        key: Sequence[int] | None,
        key_header: bytes,
        value_header: bytes,
        names: bytes,
        epoch: datetime,
    ) -> None: ...
    def encode(
        self,
        data: bytes,
        commit_time: datetime,
        sequence: int,
        lsn: int,
        xid: int,
        op: Operation,
        /,
    ) -> tuple[bytes | None, bytes] | None: ...
