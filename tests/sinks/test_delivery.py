"""The delivery machinery every sink shares, as pure logic with a fake clock: the retry
policy (pg2sink/retry.py) and the delivery engine (pg2sink/sinks/delivery/)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from pg2sink.errors import SinkError
from pg2sink.observability.stats import StreamStats
from pg2sink.retry import Backoff, bounded_wait, retries_within
from pg2sink.sinks.delivery import Acks, Marks, Outages, Outbox, Sent, Window
from pg2sink.sinks.kafka.acks import Checkpoints


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the retry policy ----------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(1.0, 10.0, clock=FakeClock())
    assert [backoff.failed() for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    assert backoff.attempts == 6


def test_jitter_takes_a_random_share_of_the_bound() -> None:
    draws = iter([0.0, 1.0, 0.5])
    backoff = Backoff(1.0, 10.0, jitter=0.2, rand=lambda: next(draws), clock=FakeClock())
    assert [backoff.failed() for _ in range(3)] == pytest.approx([0.8, 2.0, 3.6])
    assert bounded_wait(3, 0.1, 5.0, 1.0, lambda: 0.5) == pytest.approx(0.4)  # full jitter
    assert bounded_wait(10_000, 0.1, 5.0) == 5.0  # no overflow however long it failed


def test_retries_within_a_deadline_are_the_waits_that_fit_in_it() -> None:
    # waits 1, 2, 4, 4, 4 ...: 1+2+4 = 7 <= 7 < 11
    assert [retries_within(d, 1.0, 4.0) for d in (0.0, 0.9, 1.0, 6.9, 7.0, 10.9, 11.0)] == [
        0,
        0,
        1,
        2,
        3,
        3,
        4,
    ]


def test_a_success_resets_only_after_the_healthy_period() -> None:
    clock = FakeClock()
    backoff = Backoff(1.0, 30.0, healthy=3.0, clock=clock)
    assert [backoff.failed() for _ in range(3)] == [1, 2, 4]
    backoff.succeeded()
    clock.now += 2.9  # failed again too soon: still growing
    assert backoff.failed() == 8
    backoff.succeeded()
    clock.now += 3.0
    assert [backoff.failed(), backoff.failed()] == [1, 2]


def test_without_a_healthy_period_any_success_resets() -> None:
    backoff = Backoff(0.1, 5.0, clock=FakeClock())
    assert [backoff.failed(), backoff.failed()] == pytest.approx([0.1, 0.2])
    backoff.succeeded()
    assert backoff.failed() == pytest.approx(0.1)
    backoff.failed()
    backoff.reset()
    assert backoff.failed() == pytest.approx(0.1)


# --- acknowledgements to LSNs --------------------------------------------------------------


def test_acks_count_only_without_a_gap() -> None:
    acks = Acks()
    acks.sent = 5
    assert not acks.acknowledge(1) and not acks.acknowledge(2)  # ahead of a gap
    assert acks.count == 0
    assert acks.acknowledge(0) and acks.count == 3  # the gap filled: 0, 1, 2
    assert not acks.acknowledge(1) and not acks.acknowledge(7)  # a repeat; never sent
    assert acks.acknowledge(3) and acks.count == 4


def test_a_checkpoint_waits_for_every_message_before_it() -> None:
    window = Window(10, 1000)
    window.checkpoint(0, 50)  # nothing written before it
    window.checkpoint(3, 100)
    window.checkpoint(3, 120)  # nothing written since: the mark moves
    window.checkpoint(5, 110)  # never backwards
    window.checkpoint(5, 200)
    report = (window.generation, 4, 400)
    assert window.acknowledged(window.own(report)[0]) == 120
    assert window.acknowledged(5) == 200
    noted = [(6, 250), (6, 260), (8, 300)]  # as a sink notes them on its hot path
    window.take(noted)
    assert noted == [] and window.acknowledged(7) == 260 and window.acknowledged(8) == 300


def test_a_report_of_another_generation_counts_nothing() -> None:
    window = Window(2, 1000)
    window.checkpoint(3, 100)
    old = (window.generation, 3, 30)
    window.restart()
    assert window.own(old) == (0, 0)
    assert window.acknowledged(window.own(old)[0]) is None
    window.checkpoint(1, 200)
    assert window.acknowledged(window.own((window.generation, 1, 10))[0]) == 200


def test_the_in_flight_bound_counts_messages_and_bytes() -> None:
    window = Window(2, 100)
    assert not window.full(2, 100, (1, 0, 0))
    assert window.full(3, 100, (1, 0, 0))
    assert window.full(1, 101, (1, 0, 0))
    assert not window.full(3, 150, (1, 1, 50))
    assert window.full(3, 150, (0, 1, 50))  # the acks of an older generation free nothing


def test_random_interleavings_never_confirm_past_what_the_server_acknowledged() -> None:
    """Random writes, checkpoints, acknowledgements in any order, late acknowledgements of
    an older generation and restarts (seeded, many rounds): the LSN the sink confirms is
    never above the highest checkpoint whose every earlier message of its generation the
    server acknowledged, and once all is acknowledged it is the last checkpoint."""
    for seed in range(300):
        rng = random.Random(seed)
        window, acks = Window(1 << 30, 1 << 30), Acks()
        generation = window.generation
        written, lsn, confirmed = 0, 0, 0
        acked: set[tuple[int, int]] = set()  # (generation, serial) the server acknowledged
        marks: list[tuple[int, int, int]] = []  # (generation, written before, lsn)
        unacked: list[tuple[int, int]] = []
        report = (generation, 0, 0)
        for _ in range(rng.randrange(50, 400)):
            step = rng.random()
            if step < 0.35:
                unacked.append((window.generation, written))
                written += 1
                acks.sent = written
            elif step < 0.5:
                lsn += rng.randrange(1, 100)
                window.checkpoint(written, lsn)
                marks.append((window.generation, written, lsn))
            elif step < 0.85 and unacked:
                g, serial = unacked.pop(rng.randrange(len(unacked)))
                acked.add((g, serial))
                if g == generation:  # the client thread ignores another generation's
                    acks.acknowledge(serial)
                    report = (generation, acks.count, 0)
            elif step < 0.87:
                window.restart()  # a replay: a late ack of the old generation may come
                generation = window.generation
                acks.clear()
                written = 0
            got = window.acknowledged(window.own(report)[0])
            truth = max(
                (m for g, w, m in marks if all((g, s) in acked for s in range(w))), default=0
            )
            assert got is None or got <= truth, (seed, got, truth)
            assert got is None or got >= confirmed, seed  # never backwards
            confirmed = max(confirmed, got or 0)
        for g, serial in unacked:  # the server acknowledges the rest
            if g == generation:
                acks.acknowledge(serial)
        final = window.acknowledged(acks.count)
        last = [m for g, _, m in marks if g == generation]
        if last:
            assert final == last[-1], seed


class _ClientThread:
    """The client thread's side as the NATS client keeps it (the engine's Sent), its
    server's acknowledgements given by the test: what Outbox sees of a client."""

    def __init__(self) -> None:
        self.sent: Sent[int] = Sent()
        self.generation = 0
        self.acked = (0, 0, 0)
        self.failure: tuple[int, SinkError] | None = None

    def submit(self, generation: int, batch: Sequence[int]) -> None:
        if generation != self.generation:  # a replay: the older generation's are dropped
            self.generation = generation
            self.sent.clear()
        self.sent.keep(list(batch), [1] * len(batch))

    def acknowledge(self, serial: int) -> None:
        if self.sent.acknowledge(serial):
            self.acked = (self.generation, self.sent.count, self.sent.size)


def test_an_outbox_never_confirms_past_what_the_server_acknowledged() -> None:
    """The sink thread's side the message sinks share (Outbox), driven with random
    writes, checkpoints, acknowledgement checks, acknowledgements in any order, a
    failure of the server and the replay after it (seeded, many rounds): what it
    confirms is never above the highest checkpoint whose every earlier message of its
    generation the server acknowledged, and once all is acknowledged it is the last."""
    for seed in range(300):
        rng = random.Random(seed)
        outbox: Outbox[int] = Outbox(rng.choice((1, 4, 16)), 1 << 30, 1 << 30)
        client = outbox.client = _ClientThread()
        written, lsn, confirmed = 0, 0, 0
        marks: list[tuple[int, int, int]] = []  # (generation, written before, lsn)
        acked: set[tuple[int, int]] = set()  # (generation, serial) the server acknowledged
        for _ in range(rng.randrange(50, 400)):
            step = rng.random()
            generation = outbox._window.generation
            if step < 0.35:
                outbox.put(written, 1)
                written += 1
            elif step < 0.5:
                lsn += rng.randrange(1, 100)
                outbox.checkpoint(lsn)
                marks.append((generation, written, lsn))
            elif step < 0.85 and client.sent.sent > client.sent.count:
                serial = rng.randrange(client.sent.count, client.sent.sent)
                acked.add((client.generation, serial))
                client.acknowledge(serial)
            elif step < 0.87:
                client.failure = (generation, SinkError("refused"))
                with pytest.raises(SinkError):
                    outbox.acknowledged()
                written = 0  # PostgreSQL replays from the last confirmed position
                continue
            got = outbox.acknowledged()
            truth = max(
                (m for g, w, m in marks if all((g, s) in acked for s in range(w))), default=0
            )
            assert got is None or got <= truth, (seed, got, truth)
            assert got is None or got >= confirmed, seed  # never backwards
            confirmed = max(confirmed, got or 0)
        outbox.acknowledged()  # hands the last batch over
        for serial in range(client.sent.count, client.sent.sent):
            client.acknowledge(serial)
        last = [m for g, _, m in marks if g == outbox._window.generation]
        if last and written:
            assert outbox.acknowledged() == last[-1], seed


def test_the_kinesis_and_kafka_bookkeeping_never_confirm_past_what_was_acknowledged() -> None:
    """The other message sinks' use, driven the same random way (seeded, many rounds):
    Kinesis notes Marks by the entries written and asks them with the entries stored in
    order (its sender puts one request at a time), forgetting them when its queue is
    dropped for a replay; Kafka's Checkpoints are acknowledged by a drain, which its sink
    sees only once every message produced is delivered (in any order), and start anew
    after a failure. Neither confirms a checkpoint before every message written before
    it is stored."""
    for seed in range(300):
        rng = random.Random(seed)
        marks, written, stored, lsn = Marks(), 0, 0, 0
        kinesis: list[tuple[int, int]] = []  # (written before, lsn) of this generation
        kafka, produced, delivered = Checkpoints(), 0, set[int]()
        kafka_marks: list[tuple[int, int]] = []
        best = kafka_best = 0
        for _ in range(rng.randrange(50, 400)):
            step = rng.random()
            if step < 0.35:
                written += 1
                produced += 1
            elif step < 0.5:
                lsn += rng.randrange(1, 100)
                marks.checkpoint(written, lsn)
                kinesis.append((written, lsn))
                kafka.checkpoint(lsn)
                kafka_marks.append((produced, lsn))
            elif step < 0.8:
                stored = rng.randrange(stored, written + 1)  # a request stored, in order
                if produced:
                    delivered.add(rng.randrange(produced))
            elif step < 0.82:
                marks.forget()  # the queue dropped: the replay writes it again
                written = stored = 0
                kinesis.clear()
                kafka, produced = Checkpoints(), 0  # a failure: the sink starts anew
                delivered.clear()
                kafka_marks.clear()
                kafka_best = 0
            if len(delivered) == produced:  # the producer is seen empty
                kafka.drained()
            # what could be confirmed: the highest checkpoint ever acknowledged in full
            # (one of an older generation stays confirmed)
            best = max([best, *(m for w, m in kinesis if w <= stored)])
            got = marks.acknowledged(stored)
            assert got is None or got <= best, (seed, got, best)
            kafka_best = max(
                [kafka_best, *(m for p, m in kafka_marks if delivered >= set(range(p)))]
            )
            got = kafka.acknowledged()
            assert got is None or got <= kafka_best, (seed, got, kafka_best)
            if len(delivered) == produced and kafka_marks:
                assert got == kafka_marks[-1][1], seed


# --- outages and health --------------------------------------------------------------------


def test_one_outage_is_one_start_and_one_recovery_whatever_the_attempts() -> None:
    clock, told = FakeClock(), list[str]()
    outages = Outages("NATS at nats://h:4222", clock)
    outages.report_to(told.append)
    assert outages.recovered() is None  # no outage: nothing to say
    assert outages.trouble("connection refused")
    clock.now += 2
    assert not outages.trouble("timed out")  # the same outage
    assert outages.down and outages.describe() == "NATS at nats://h:4222: timed out"
    clock.now += 28
    assert outages.recovered() == (30.0, 2)
    assert not outages.down and outages.recovered() is None
    assert outages.trouble("refused")  # the next outage counts anew
    assert told == [
        "",
        "NATS at nats://h:4222: connection refused",
        "",
        "NATS at nats://h:4222: refused",
    ]


def test_health_follows_outages_in_the_stream_stats() -> None:
    stats = StreamStats()
    stats.sink_up()
    outages = Outages("Kinesis stream 's'")
    outages.report_to(stats.sink_outage)
    assert stats.sink_healthy
    outages.trouble("no connection")
    assert not stats.sink_healthy and stats.sink_reason == "Kinesis stream 's': no connection"
    outages.recovered()
    assert stats.sink_healthy


def test_the_nats_acks_count_runs_and_single_acks_in_any_order_without_gaps() -> None:
    """The NATS client's Sent (the engine's Acks, with a fast path for a read's run of
    PubAcks and a resend after a lost connection), fed random runs, single acks,
    repeats and resends (seeded, many rounds): its count is always the length of the
    longest acknowledged prefix, and its bytes those of that prefix."""
    for seed in range(300):
        rng = random.Random(seed)
        sent, acked = Sent[tuple[bytes, bytes, bytes]](), set[int]()
        sizes: list[int] = []
        for _ in range(rng.randrange(20, 200)):
            step = rng.random()
            if step < 0.3:
                n = rng.randrange(1, 8)
                chunk = [(b"s", b"x" * rng.randrange(0, 9), b"") for _ in range(n)]
                sent.keep(chunk, [len(p) for _, p, _ in chunk])
                sizes += [len(p) for _, p, _ in chunk]
            elif step < 0.6 and sent.sent > sent.count:  # a run, often the next in order
                first = sent.count if rng.random() < 0.7 else rng.randrange(sent.sent)
                run = list(range(first, min(sent.sent, first + rng.randrange(1, 6))))
                sent.acknowledge_run([b"%d" % s for s in run])
                acked.update(run)
            elif step < 0.9 and sent.sent:
                serial = rng.randrange(sent.sent)
                sent.acknowledge(serial)
                acked.add(serial)
            elif step < 0.93:  # a lost connection: what is not acknowledged goes again
                again = sent.resend()
                acked = {s for s in acked if s < sent.count}
                del sizes[sent.count :]
                if again:
                    sent.keep(again, [len(p) for _, p, _ in again])
                    sizes += [len(p) for _, p, _ in again]
            prefix = 0
            while prefix in acked and prefix < sent.sent:
                prefix += 1
            assert sent.count == prefix, seed
            assert sent.size == sum(sizes[:prefix]), seed
