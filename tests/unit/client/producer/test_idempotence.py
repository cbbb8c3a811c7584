"""Sequence bookkeeping of the idempotent producer (idempotence.py), checked on the bytes it sends."""

from __future__ import annotations

import time

from oncelog.client.producer.accumulator import ProducerBatch, RecordAccumulator
from oncelog.client.producer.idempotence import MAX_SEQUENCE, Idempotence, Identity, Partition, restamp
from oncelog.records.batch import crc_ok, read_header
from oncelog.records.reader import read_batches


def batch(count: int, tag: str = "r", transactional: bool = False) -> ProducerBatch:
    b = ProducerBatch("t", 0, 0, transactional, True, time.monotonic() + 60)
    for i in range(count):
        b.append(None, f"{tag}{i}".encode(), None, 1_700_000_000_000 + i, None)
    return b


def sent(part: Partition, *counts: int) -> list[ProducerBatch]:
    out = []
    for n in counts:
        b = batch(n)
        part.assign(b)
        b.in_request = True
        out.append(b)
    return out


def test_sequences_are_assigned_once_and_written_into_the_header():
    idem = Idempotence()
    idem.set_identity(Identity(42, 3))
    part = idem.partition(("t", 0))
    assert idem.ready_for_new(part)
    a, b = sent(part, 3, 2)
    for got, seq, n in [(a, 0, 3), (b, 3, 2)]:
        header = read_header(got.buf)
        assert (header.producer_id, header.producer_epoch, header.base_sequence, header.record_count) == \
            (42, 3, seq, n)
        assert crc_ok(got.buf, 0, header)
    assert part.next_seq == 5
    assert list(part.unresolved) == [a, b]


def test_the_test_hook_starts_each_partitions_first_sequences_only():
    idem = Idempotence(initial_sequence=MAX_SEQUENCE - 4)
    idem.set_identity(Identity(1, 0))
    part = idem.partition(("t", 0))
    assert idem.ready_for_new(part)
    (a,) = sent(part, 3)
    assert a.base_sequence == MAX_SEQUENCE - 4
    assert part.overflows(2) is False and part.overflows(3) is True  # 2^31-2, 2^31-1 fit; a third does not
    assert idem.bump_local()
    assert idem.identity == Identity(1, 1)
    assert not idem.ready_for_new(part), "a partition keeps its old epoch while a batch of it is unresolved"
    part.acknowledged(a, 10)
    assert idem.ready_for_new(part)
    (b,) = sent(part, 1)
    assert (b.producer_epoch, b.base_sequence) == (1, 0)
    other = idem.partition(("t", 1))  # a partition that starts under the new epoch still gets the hook's start
    assert idem.ready_for_new(other) and other.next_seq == MAX_SEQUENCE - 4


def test_epoch_exhaustion_needs_a_new_producer_id():
    idem = Idempotence()
    idem.set_identity(Identity(5, 32765))
    assert idem.bump_local()
    assert idem.identity == Identity(5, 32766)
    assert not idem.bump_local()


def test_in_flight_window_stays_inside_the_brokers_duplicate_window():
    idem = Idempotence()
    idem.set_identity(Identity(1, 0))
    part = idem.partition(("t", 0))
    idem.ready_for_new(part)
    sent(part, *[400] * 5)  # five batches of any size: the broker caches them all
    assert part.may_send(1) is False, "a sixth would leave the first 2000 sequences behind the newest"
    small = Partition()
    small.adopt(Identity(1, 0))
    sent(small, *[100] * 9)
    assert small.may_send(100) and not small.may_send(101)  # 1000 sequences from the oldest to the newest, not more


def test_is_head_and_fail_from_take_every_later_batch():
    part = Partition()
    part.adopt(Identity(1, 0))
    a, b, c = sent(part, 1, 2, 3)
    assert part.is_head(a) and not part.is_head(b)
    assert part.fail_from(b) == [b, c]
    assert list(part.unresolved) == [a]
    assert part.fail_from(c) == []


def test_retries_wait_until_nothing_is_in_flight():
    part = Partition()
    part.adopt(Identity(1, 0))
    a, b, c = sent(part, 1, 1, 1)
    a.in_request = False  # a failed with a retriable error; b and c are still out
    assert part.retry_pending() and part.retry_ready() == []
    b.in_request = c.in_request = False
    assert part.retry_ready() == [a, b, c]


def test_acknowledged_tracks_the_last_offset_and_its_batch():
    part = Partition()
    part.adopt(Identity(9, 2))
    a, b = sent(part, 2, 3)
    part.acknowledged(a, 100)
    assert (part.acked_seq, part.last_acked_offset, part.last_acked_batch) == (1, 101, (9, 2, 1))
    part.acknowledged(b, -1)  # a duplicate: the broker did not say where
    assert (part.acked_seq, part.last_acked_offset) == (4, 101)
    assert not part.unresolved


def test_restamp_gives_an_unwritten_batch_a_new_identity_with_a_valid_crc():
    part = Partition()
    part.adopt(Identity(3, 0))
    (a,) = sent(part, 4)
    a.possibly_written = False
    restamp(a, Identity(3, 1), 0)
    header = read_header(a.buf)
    assert (header.producer_epoch, header.base_sequence) == (1, 0)
    assert crc_ok(a.buf, 0, header)
    (decoded,) = read_batches(a.buf)
    assert [r.value for r in decoded.records] == [b"r0", b"r1", b"r2", b"r3"]


def test_unwritten_tail_refuses_a_possibly_written_batch():
    part = Partition()
    part.adopt(Identity(3, 0))
    a, b = sent(part, 1, 1)
    a.possibly_written = True
    assert part.unwritten_tail(a) is None
    a.possibly_written = False
    assert part.unwritten_tail(a) == [a, b]


def test_accumulator_batches_by_size_and_count_and_lingers():
    closed = []
    acc = RecordAccumulator(batch_size=1000, batch_records=3, linger_ms=50, delivery_timeout_ms=60000,
                            on_batch_closed=lambda t, p: closed.append((t, p)))
    with acc.lock:
        for _ in range(7):
            acc.append("t", 0, None, b"x" * 10, None, 1, None, False)
        now = time.monotonic()
        first, _ = acc.head_ready(("t", 0), now)
        assert first is not None and first.count == 3  # full by count
        acc.pop(("t", 0))
        acc.pop(("t", 0))
        last, due = acc.head_ready(("t", 0), now)
        assert last is None and due > now  # one record, lingering
        assert acc.head_ready(("t", 0), now + 0.06)[0] is not None
        batch_obj, _, wake = acc.append("t", 1, None, b"y" * 2000, None, 1, None, False)
        assert wake and batch_obj.count == 1  # a record larger than batch.size still gets a batch of its own
    assert closed == [("t", 0), ("t", 0), ("t", 1)]  # each full batch once, when it filled up
    assert acc.queued_records == 2
