"""What a stage in front of the changelog builder may tell the replication loop.

The replication loop feeds each pgoutput message to its handler, whose `feed` is the
builder's or that of a stage in front of it (the import gate, pg2sink.imports.gate).
A stage passes a message on, leaves it out, or holds it: it raises `Held` before
anything of the message reached the builder. The loop then keeps its housekeeping going
(flushes, status updates), waits with `Held.wait`, and feeds the same message again.

This module imports nothing of pg2sink, so the loop, the builder and every stage can
depend on it without depending on each other.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Held"]


class Held(Exception):  # noqa: N818 (a signal to the loop, not an error)
    """The message must wait; nothing of it was handled. Feed it again later.

    `str(held)` says why (logged when the stream pauses), `resumed` what the loop logs
    once the message went through, and `wait(timeout)` blocks until the holder's state
    changes or `timeout` seconds pass.
    """

    def __init__(self, reason: str, resumed: str, wait: Callable[[float], None]) -> None:
        super().__init__(reason)
        self.resumed = resumed
        self.wait = wait
