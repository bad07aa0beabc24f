"""The delivery engine every message and warehouse sink shares; a sink keeps its client
calls.

What each part owns (each is pure logic, tested with a fake clock in
tests/sinks/test_delivery.py; the retry policy is pg2sink/retry.py):

    acks.py     Acks: the server's acknowledgements, in any order, as the count of
                messages acknowledged with no gap (a later ack never covers an earlier
                unacknowledged message), per generation;
                Marks: checkpoints (LSNs) by the count of messages written before them,
                so a checkpoint is confirmed only once that count is acknowledged;
                Window: the sink thread's side: the generation (a replay starts a new
                one, and acknowledgements of an older one are dropped), its Marks, and
                the in-flight bound (messages and bytes written and not acknowledged).
    sent.py     Sent: Acks that keep the messages sent until acknowledged, to send
                again in order on a new connection (the client thread's side).
    outbox.py   Outbox: the sink thread's side of a message sink over a client thread
                (batches handed over, checkpoints, the in-flight bound, waits, the
                failure of a generation and the restart after it).
    outages.py  Outages: one WARNING when an outage starts, one INFO at recovery, and
                the sink's health for GET /status and pg2sink_sink_healthy
                (StreamStats.sink_outage), the same way for every sink.

How a sink uses it: it counts what it writes (plain attributes on its hot path: no call
per message), hands `Window.checkpoint` that count at each checkpoint (or notes
(count, lsn) in a list that `Window.take` takes at batch level), and asks
`Window.acknowledged` with the count its client thread reports (`Acks.count`, or the
requests a sender stored in order). On a failure that makes PostgreSQL replay, it calls
`Window.restart` and its client thread drops the older generation's late acks.
"""

from pg2sink.sinks.delivery.acks import Acks, Marks, Window
from pg2sink.sinks.delivery.outages import Outages
from pg2sink.sinks.delivery.outbox import Outbox
from pg2sink.sinks.delivery.sent import Sent

__all__ = ["Acks", "Marks", "Outages", "Outbox", "Sent", "Window"]
