"""The application side of the fetch buffer: chunk order, stale chunks after a seek, positions with a
partly consumed chunk, batch takes, parked chunks of paused partitions, and the max.poll.interval mark."""

from __future__ import annotations

from oncelog.client.consumer.consumer import _Feed
from oncelog.client.consumer.fetcher import Chunk, FetchEvent, PartitionState
from oncelog.client.types import TIMESTAMP_CREATE_TIME, error_message, message_class


class _States:
    """What the feed needs of a Fetcher: the assignment and a wake-up it can count."""

    def __init__(self, *states: PartitionState) -> None:
        self.states = {s.tp: s for s in states}
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


def chunk(state: PartitionState, offsets: range, next_offset: int | None = None) -> Chunk:
    cls = message_class(state.topic, state.partition, TIMESTAMP_CREATE_TIME, None, has_headers=False)
    records = [(o, 0, None, b"%d" % o) for o in offsets]
    state.chunks_put += 1
    return Chunk(state, records, [(0, cls)] if records else [], offsets.stop if next_offset is None else next_offset)


def feed_with(*states: PartitionState) -> tuple[_Feed, _States]:
    feed = _Feed()
    fetcher = _States(*states)
    feed.fetcher = fetcher  # type: ignore[assignment]
    return feed, fetcher


def drain(feed: _Feed) -> list[tuple[int, int]]:
    out = []
    while (m := feed.next_message()) is not None:
        out.append((m.partition(), m.offset()))
    return out


def test_chunks_in_order_and_position_after_trailing_control_records():
    a = PartitionState("t", 0)
    feed, _ = feed_with(a)
    feed.buffer.put(chunk(a, range(0, 3)))
    feed.buffer.put(chunk(a, range(3, 5), next_offset=7))  # offsets 5, 6: a marker and an aborted batch
    assert drain(feed) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]
    assert feed.positions() == {("t", 0): 7}
    assert a.chunks_done == 2


def test_position_counts_a_partly_consumed_chunk():
    a = PartitionState("t", 0)
    a.position = 10
    feed, _ = feed_with(a)
    feed.buffer.put(chunk(a, range(10, 20)))
    assert feed.next_message().offset() == 10
    assert feed.next_message().offset() == 11
    assert feed.positions() == {("t", 0): 12}


def test_a_seek_makes_buffered_chunks_and_events_stale():
    a = PartitionState("t", 0)
    feed, _ = feed_with(a)
    feed.buffer.put(chunk(a, range(0, 5)))
    feed.buffer.put(FetchEvent(a, error_message(RuntimeError("old"), "t", 0)))
    assert feed.next_message().offset() == 0
    a.seek(100)
    feed.buffer.put(chunk(a, range(100, 102)))
    assert drain(feed) == [(0, 100), (0, 101)]
    assert a.chunks_done == a.chunks_put == 2


def test_take_slices_chunks_and_stops_after_an_event():
    a, b = PartitionState("t", 0), PartitionState("t", 1)
    feed, _ = feed_with(a, b)
    feed.buffer.put(chunk(a, range(0, 4)))
    feed.buffer.put(chunk(b, range(0, 4)))
    feed.buffer.put(FetchEvent(b, error_message(RuntimeError("eof"), "t", 1, 4)))
    feed.buffer.put(chunk(a, range(4, 6)))
    out: list = []
    feed.take(6, out)
    assert [(m.partition(), m.offset()) for m in out] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    out = []
    feed.take(100, out)
    assert [(m.partition(), m.offset()) for m in out[:-1]] == [(1, 2), (1, 3)] and out[-1].error() is not None
    out = []
    feed.take(100, out)
    assert [m.offset() for m in out] == [4, 5]


def test_paused_partition_chunks_are_parked_and_come_back_on_resume():
    a, b = PartitionState("t", 0), PartitionState("t", 1)
    feed, _ = feed_with(a, b)
    feed.buffer.put(chunk(a, range(0, 3)))
    feed.buffer.put(chunk(b, range(0, 2)))
    assert feed.next_message().offset() == 0  # partition 0 is current
    a.paused = True
    feed.pause(a.tp)
    assert a.position == 1  # its progress is kept
    assert drain(feed) == [(1, 0), (1, 1)]
    a.paused = False
    feed.resume(a.tp)
    assert drain(feed) == [(0, 1), (0, 2)]


def test_finishing_a_chunk_at_the_buffer_limit_wakes_the_fetcher():
    a = PartitionState("t", 0)
    feed, fetcher = feed_with(a)
    feed.buffer.put(chunk(a, range(0, 1)))
    feed.buffer.put(chunk(a, range(1, 2)))
    assert drain(feed) == [(0, 0), (0, 1)]
    assert fetcher.wakes == 1  # the first finish went from 2 buffered to 1; the second from 1 to 0


def test_progress_mark_moves_with_every_message_and_is_none_while_waiting():
    a = PartitionState("t", 0)
    feed, _ = feed_with(a)
    feed.buffer.put(chunk(a, range(0, 3)))
    feed.next_message()
    first = feed.progress_mark()
    feed.next_message()
    assert feed.progress_mark() != first
    feed.waiting = True
    assert feed.progress_mark() is None


def test_a_chunk_with_two_kinds_of_message_hands_out_each_with_its_class():
    a = PartitionState("t", 0)
    feed, _ = feed_with(a)
    plain = message_class("t", 0, TIMESTAMP_CREATE_TIME, None, has_headers=False)
    epoch5 = message_class("t", 0, TIMESTAMP_CREATE_TIME, 5, has_headers=True)
    a.chunks_put += 1
    feed.buffer.put(Chunk(a, [(0, 0, None, b"a"), (1, 0, None, b"b", [("h", b"x")])], [(0, plain), (1, epoch5)], 2))
    first, second = feed.next_message(), feed.next_message()
    assert (first.leader_epoch(), first.headers()) == (None, None)
    assert (second.leader_epoch(), second.headers()) == (5, [("h", b"x")])
    a.seek(0)
    feed.buffer.put(Chunk(a, [(0, 0, None, b"a"), (1, 0, None, b"b", [])], [(0, plain), (1, epoch5)], 2))
    out: list = []
    feed.take(10, out)
    assert [m.leader_epoch() for m in out] == [None, 5]


def test_parked_chunks_of_a_partition_unassigned_while_paused_are_dropped():
    a, b = PartitionState("t", 0), PartitionState("t", 1)
    feed, _ = feed_with(a, b)
    feed.buffer.put(chunk(a, range(0, 3)))
    a.paused = True
    assert feed.next_message() is None  # parked
    assert list(feed.parked) == [a.tp]
    a.version += 1  # unassigned (the fetcher bumps the version)
    feed.buffer.put(chunk(b, range(0, 1)))
    assert drain(feed) == [(1, 0)]
    assert feed.parked == {} and a.chunks_done == a.chunks_put
