"""Type stubs of the C extension _avro_native.c (see avro_native.py)."""

from collections.abc import Sequence

def compile_plan(columns: Sequence[tuple[int, int, int]], key: Sequence[int] | None) -> object: ...
def encode_new_row(
    data: bytes,
    plan: object,
    key_header: bytes,
    head: bytes,
    sequence: int,
    lsn: int,
    mid: bytes,
    tail: bytes,
    /,
) -> tuple[bytes | None, bytes] | None: ...
