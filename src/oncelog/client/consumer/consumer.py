"""Consumer (synchronous) and AsyncConsumer: confluent-kafka's consumer API over the fetcher and the group.

Both facades share one core that lives on an event loop (the fetcher, the group member, the
offset client). `AsyncConsumer` runs it on the caller's loop; `Consumer` runs it on the
client's background loop thread and reads fetched chunks directly from the thread it is
called on, so the per-message cost of `poll()` is an index increment, never a hop between
threads. Rebalance callbacks, commits of revoked partitions and auto-commits run on the
application's side inside poll()/consume(), as in confluent-kafka and the Java client.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from oncelog.client.cluster import Cluster
from oncelog.client.config import ClientConfig
from oncelog.client.consumer.fetcher import (
    MAX_BUFFERED_CHUNKS,
    RESET_COMMITTED,
    RESET_EARLIEST,
    RESET_LATEST,
    Chunk,
    FetchBuffer,
    Fetcher,
    FetchEvent,
)
from oncelog.client.consumer.group import GroupMember, RebalanceEvent
from oncelog.client.consumer.offsets import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    CommitFailed,
    OffsetClient,
)
from oncelog.client.errors import KafkaError
from oncelog.client.runtime import get_runtime
from oncelog.client.types import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    ConsumerGroupMetadata,
    Message,
    TopicPartition,
    error_message,
)

log = logging.getLogger(__name__)
_new_tuple = tuple.__new__

TP = tuple[str, int]
OffsetMap = dict[TP, tuple[int, str | None, int | None]]


def _config(conf: Mapping[str, Any] | ClientConfig) -> ClientConfig:
    return conf if isinstance(conf, ClientConfig) else ClientConfig(conf, "consumer")


def _timeout(timeout: float | None) -> float | None:
    """confluent-kafka's convention: None or a negative number waits forever."""
    return None if timeout is None or timeout < 0 else timeout


def _deadline(timeout: float | None) -> float | None:
    timeout = _timeout(timeout)
    return None if timeout is None else time.monotonic() + timeout


_DONE = -1.0  # what `_Feed.collect` and `_left` return when the call has nothing more to wait for


def _left(deadline: float | None) -> float | None:
    """Seconds to wait until `deadline` (None: no end), or _DONE when it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    return left if left > 0 else _DONE


class _Core:
    """The loop side: cluster, fetcher, offsets and group member, used through coroutines."""

    def __init__(self, config: ClientConfig, feed: _Feed) -> None:
        self.config = config
        self.group_id: str | None = config["group.id"]
        self.read_committed = config["isolation.level"] == "read_committed"
        self.api_timeout = 2 * config["request.timeout.ms"] / 1000
        self.cluster = Cluster(config)
        self.offsets = OffsetClient(self.cluster, config["request.timeout.ms"] / 1000,
                                    config["retry.backoff.ms"] / 1000)
        self.feed = feed
        self.fetcher = Fetcher(self.cluster, self.offsets, config, feed.buffer,
                               self._committed_offsets if self.group_id else None)
        feed.fetcher = self.fetcher
        self.group: GroupMember | None = None
        self.started = False
        self.closed = False
        self._starting: asyncio.Future | None = None

    async def start(self) -> None:
        """Bootstrap once; concurrent callers wait for the same start."""
        if self.started:
            return
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        await self.cluster.bootstrap()
        self.fetcher.start()
        if self.group_id:
            self.group = GroupMember(self.cluster, self.config, self.feed.post_group_event, self.feed.post_error,
                                     liveness=self.feed.progress_mark,
                                     drop_assignment=lambda: self.fetcher.assign([]))
        self.started = True

    async def _committed_offsets(self, tps: list[TP]) -> dict[TP, int]:
        assert self.group_id is not None
        found = await self.offsets.fetch_committed(self.group_id, tps, timeout=self.api_timeout)
        return {tp: c.offset for tp, c in found.items()}

    def group_metadata(self) -> ConsumerGroupMetadata:
        if self.group_id is None:
            raise KafkaError("the consumer has no group.id")
        if self.group is not None and self.group.generation_id >= 0:
            return self.group.metadata()
        return ConsumerGroupMetadata(self.group_id, -1, "", self.config["group.instance.id"])

    # -- coroutines behind the public methods -----------------------------------------------------------

    async def subscribe(self, topics: list[str]) -> None:
        await self.start()
        if self.group is None:
            raise KafkaError("subscribe() needs group.id")
        literal = [t for t in topics if not t.startswith("^")]  # "^..." are patterns, matched by the group
        if literal:
            await self.cluster.refresh_metadata(literal)
        self.group.subscribe(topics)

    async def unsubscribe(self) -> None:
        await self.start()
        if self.group is not None:
            await self.group.unsubscribe()
        self.fetcher.assign([])

    async def assign(self, partitions: list[TopicPartition]) -> None:
        await self.start()
        self.fetcher.assign([((tp.topic, tp.partition), *_start_rule(tp.offset)) for tp in partitions])

    async def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        await self.start()
        self.fetcher.add([((tp.topic, tp.partition), *_start_rule(tp.offset)) for tp in partitions])

    async def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self.fetcher.remove([(tp.topic, tp.partition) for tp in partitions])

    async def seek(self, tp: TopicPartition) -> None:
        self.fetcher.seek((tp.topic, tp.partition), *_start_rule(tp.offset))

    async def commit(self, offsets: OffsetMap) -> None:
        await self.start()
        await self.offsets.commit(self.group_metadata(), offsets, timeout=self.api_timeout)

    async def committed(self, tps: list[TP], timeout: float | None) -> dict[TP, Any]:
        await self.start()
        if self.group_id is None:
            raise KafkaError("committed() needs group.id")
        return await self.offsets.fetch_committed(self.group_id, tps, timeout=timeout or self.api_timeout)

    async def list_offsets(self, timestamps: dict[TP, int], timeout: float | None, *,
                           read_committed: bool) -> dict[TP, Any]:
        await self.start()
        return await self.offsets.list_offsets(timestamps, read_committed=read_committed,
                                               timeout=timeout or self.api_timeout)

    async def close(self, final_commit: OffsetMap | None) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.started:
            return
        if final_commit and self.group_id:
            try:
                await self.offsets.commit(self.group_metadata(), final_commit, timeout=self.api_timeout)
            except KafkaError as exc:
                log.warning("final auto-commit on close failed: %s", exc)
        if self.group is not None:
            await self.group.close()
        await self.fetcher.close()
        await self.cluster.close()


def _start_rule(offset: int) -> tuple[int | None, str]:
    if offset >= 0:
        return offset, RESET_COMMITTED
    if offset == OFFSET_BEGINNING:
        return None, RESET_EARLIEST
    if offset == OFFSET_END:
        return None, RESET_LATEST
    if offset in (OFFSET_INVALID, OFFSET_STORED):
        return None, RESET_COMMITTED
    raise ValueError(f"invalid offset {offset}")


class _Feed:
    """The application side of the fetch buffer: the current chunk, positions, group events."""

    def __init__(self) -> None:
        self.buffer = FetchBuffer()
        self.fetcher: Fetcher  # set by _Core
        self.cur: Chunk | None = None
        self.group_events: deque[RebalanceEvent | KafkaError] = deque()
        # Chunks of paused partitions, set aside until resume (the Java consumer keeps them too).
        self.parked: dict[TP, list[Chunk]] = {}
        # For max.poll.interval.ms: slow-path entries and whether the application waits inside poll().
        self.polls = 0
        self.waiting = False

    def progress_mark(self) -> Any:
        """Changes whenever the application takes a message; None while it waits in poll() (read on the loop)."""
        if self.waiting:
            return None
        cur = self.cur
        return (self.polls, id(cur), -1 if cur is None else cur.index)

    # called on the loop
    def post_group_event(self, event: RebalanceEvent) -> None:
        self.group_events.append(event)
        self.buffer.notify()

    def post_error(self, error: KafkaError) -> None:
        self.group_events.append(error)
        self.buffer.notify()

    # application side
    def ready(self) -> bool:
        cur = self.cur
        return bool(self.group_events or self.buffer.items or (cur is not None and cur.index < len(cur.records)))

    def _finish(self, chunk: Chunk) -> None:
        state = chunk.state
        if chunk.version == state.version:
            state.position = chunk.next_offset
        before = state.chunks_put - state.chunks_done
        state.chunks_done += 1
        if before >= MAX_BUFFERED_CHUNKS:
            self.fetcher.wake()

    def _advance(self) -> Message | None:
        """Move to the next live chunk or event; returns an event message, or None when a chunk is current."""
        cur = self.cur
        if cur is not None:
            if cur.index < len(cur.records) and cur.version == cur.state.version:
                return None
            self.cur = None
            self._finish(cur)
        if self.parked:
            self._prune_parked()
        items = self.buffer.items
        while items:
            item = items.popleft()
            if type(item) is FetchEvent:
                if item.version == item.state.version:
                    return item.message
                continue
            assert type(item) is Chunk
            if item.version != item.state.version or not item.records:
                self._finish(item)
                continue
            if item.state.paused:
                self.parked.setdefault(item.state.tp, []).append(item)
                continue
            self.cur = item
            return None
        return None

    def _prune_parked(self) -> None:
        """Drop parked chunks made stale by a seek or reassignment (a partition unassigned while paused)."""
        for tp, chunks in list(self.parked.items()):
            live = [c for c in chunks if c.version == c.state.version]
            for c in chunks:
                if c.version != c.state.version:
                    self._finish(c)
            if live:
                self.parked[tp] = live
            else:
                del self.parked[tp]

    def pause(self, tp: TP) -> None:
        cur = self.cur
        if cur is not None and cur.state.tp == tp:
            self.cur = None
            if cur.index > 0 and cur.version == cur.state.version:
                cur.state.position = cur.records[cur.index - 1][0] + 1  # its progress so far
            self.parked.setdefault(tp, []).insert(0, cur)

    def resume(self, tp: TP) -> None:
        for chunk in reversed(self.parked.pop(tp, [])):
            self.buffer.items.appendleft(chunk)

    def next_message(self) -> Message | None:
        """One message or event if one is ready now."""
        event = self._advance()
        if event is not None:
            return event
        cur = self.cur
        if cur is None:
            return None
        i = cur.index
        cur.index = i + 1
        return cur.message(i)

    def take(self, n: int, out: list[Message]) -> None:
        """Up to n - len(out) ready messages appended to `out`, a slice per chunk. Stops after an event."""
        while len(out) < n:
            event = self._advance()
            if event is not None:
                out.append(event)
                return
            cur = self.cur
            if cur is None:
                return
            i = cur.index
            j = min(len(cur.records), i + n - len(out))
            out += cur.messages(i, j)
            cur.index = j

    def collect(self, n: int, out: list[Message], deadline: float | None) -> float | None:
        """One round of consume(), shared by the sync and async consumers: take what is ready, then say how long
        to wait for more, or _DONE when `out` is full, ends with an event, the deadline has passed, or a group
        event waits while `out` holds records.

        A batch never spans a rebalance (librdkafka's rule): records taken before a revocation go back before
        on_revoke runs, and the events are served at the start of the next call (consume() serves them only
        while its batch is empty), where the revocation makes the old assignment's buffered records stale
        before anything is collected. Served in the middle of a batch, they made the application get records
        of partitions it had just been told it gave up, then the new assignment's records (from the committed
        offset, so the same ones again) in the same list."""
        if not self.group_events:
            self.take(n, out)
        if len(out) >= n or (out and (out[-1].error() is not None or self.group_events)):
            return _DONE
        return _left(deadline)

    def positions(self) -> dict[TP, int]:
        """Next offset per assigned partition with a known position, counting the current chunk's progress."""
        out: dict[TP, int] = {}
        for tp, state in self.fetcher.states.items():
            if state.position is not None:
                out[tp] = state.position
        cur = self.cur
        if cur is not None and cur.version == cur.state.version and cur.index > 0:
            tp = cur.state.tp
            if cur.index >= len(cur.records):
                out[tp] = cur.next_offset
            else:
                out[tp] = cur.records[cur.index - 1][0] + 1
        return out


def _offsets_to_commit(message: Message | None, offsets: Iterable[TopicPartition] | None,
                       positions: Callable[[], dict[TP, int]]) -> OffsetMap:
    if message is not None:
        if message.error() is not None:
            raise KafkaError("cannot commit an error message")
        return {(message.topic(), message.partition()): (message.offset() + 1, None, message.leader_epoch())}
    if offsets is not None:
        out: OffsetMap = {}
        for tp in offsets:
            if tp.offset < 0:
                raise KafkaError(f"cannot commit logical offset {tp.offset} for {tp.topic} [{tp.partition}]")
            out[(tp.topic, tp.partition)] = (tp.offset, tp.metadata, tp.leader_epoch)
        return out
    return {tp: (offset, None, None) for tp, offset in positions().items()}


def _as_list(tps: Iterable[TP], values: Mapping[TP, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p, values.get((t, p), OFFSET_INVALID)) for t, p in tps]


class _Application:
    """What both facades do on the application side; subclasses provide how to wait and to call the core."""

    def __init__(self, conf: Mapping[str, Any] | ClientConfig) -> None:
        self._conf = _config(conf)
        self._feed = _Feed()
        self._core = _Core(self._conf, self._feed)
        self._auto_commit = bool(self._conf["enable.auto.commit"]) and self._conf["group.id"] is not None
        self._auto_commit_interval = self._conf["auto.commit.interval.ms"] / 1000
        self._max_poll_records = self._conf["max.poll.records"]
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval
        self._last_committed: dict[TP, int] = {}
        self._on_assign: Callable[..., Any] | None = None
        self._on_revoke: Callable[..., Any] | None = None
        self._on_lost: Callable[..., Any] | None = None
        self._assign_called = False
        self._owned: list[TopicPartition] = []  # what the group gave us, as served to the application
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Consumer closed")

    def _due_auto_commit(self) -> OffsetMap | None:
        if not self._auto_commit or time.monotonic() < self._next_auto_commit:
            return None
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval
        return self._changed_positions()

    def _changed_positions(self) -> OffsetMap:
        """Positions not committed by an earlier auto-commit (the periodic one skips what did not move)."""
        positions = self._feed.positions()
        changed = {tp: (o, None, None) for tp, o in positions.items() if self._last_committed.get(tp) != o}
        self._last_committed.update(positions)
        return changed

    def _all_positions(self) -> OffsetMap:
        """Every position, for the commit before partitions are given up: an earlier asynchronous
        auto-commit may have failed, and this is the last chance to commit for them."""
        positions = self._feed.positions()
        self._last_committed.update(positions)
        return {tp: (o, None, None) for tp, o in positions.items()}

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self._feed.fetcher.states]

    def position(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        positions = self._feed.positions()
        return _as_list([(tp.topic, tp.partition) for tp in partitions], positions)

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        return self._core.group_metadata()

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._set_paused(partitions, True)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._set_paused(partitions, False)

    def _set_paused(self, partitions: Iterable[TopicPartition], paused: bool) -> None:
        states = self._feed.fetcher.states
        for tp in partitions:
            state = states.get((tp.topic, tp.partition))
            if state is None:
                raise KafkaError(f"{tp.topic} [{tp.partition}] is not assigned")
            state.paused = paused
            if paused:
                self._feed.pause(state.tp)
            else:
                self._feed.resume(state.tp)
        self._feed.fetcher.wake()

    def _cached_watermarks(self, partition: TopicPartition) -> tuple[int, int]:
        """(log start, high watermark) as the last fetch response of the partition told them."""
        state = self._feed.fetcher.states.get((partition.topic, partition.partition))
        if state is None:
            return (OFFSET_INVALID, OFFSET_INVALID)
        return (state.log_start_offset, state.high_watermark)


class Consumer(_Application):
    """A Kafka consumer with confluent-kafka's API: `Consumer({"bootstrap.servers": ..., "group.id": ...})`."""

    def __init__(self, conf: Mapping[str, Any] | ClientConfig) -> None:
        super().__init__(conf)
        self._rt = get_runtime()
        self._rt.run(self._core.start())

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        self._check_open()
        return self._rt.run(coro, timeout)

    # -- reading ------------------------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next message or event (check msg.error()), or None when `timeout` seconds pass without one."""
        cur = self._feed.cur
        if cur is not None:
            i = cur.index
            if i < len(cur.records) and cur.version == cur.state.version and cur.cls is not None:
                cur.index = i + 1
                return _new_tuple(cur.cls, cur.records[i])
        return self._poll_slow(timeout)

    def _poll_slow(self, timeout: float | None) -> Message | None:
        self._check_open()
        feed = self._feed
        feed.polls += 1
        deadline = _deadline(timeout)
        while True:
            msg = self._housekeeping() or feed.next_message()
            if msg is not None:
                return msg
            left = _left(deadline)
            if left == _DONE:
                return None
            feed.waiting = True
            try:
                feed.buffer.wait(left if left is None else min(left, self._auto_commit_interval), feed.ready)
            finally:
                feed.waiting = False

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to `num_messages` (at most max.poll.records) messages, waiting at most `timeout` seconds for them.

        An event (an error, end of partition) ends the list early, so it is seen in order.
        """
        self._check_open()
        num_messages = min(num_messages, self._max_poll_records)
        self._feed.polls += 1
        deadline = _deadline(timeout)
        out: list[Message] = []
        while True:
            event = self._housekeeping(serve_events=not out)  # a batch never spans a rebalance: _Feed.collect
            if event is not None:
                out.append(event)
                return out
            left = self._feed.collect(num_messages, out, deadline)
            if left == _DONE:
                return out
            self._feed.waiting = True
            try:
                self._feed.buffer.wait(left, self._feed.ready)
            finally:
                self._feed.waiting = False

    def _housekeeping(self, serve_events: bool = True) -> Message | None:
        """Serve rebalances (unless a batch is being filled) and auto-commit; a group error comes back as an
        error message for the caller."""
        feed = self._feed
        due = self._due_auto_commit()
        if due:
            future = self._rt.submit(self._core.commit(due))
            future.add_done_callback(_log_commit_failure)
        while serve_events and feed.group_events:
            event = feed.group_events.popleft()
            if isinstance(event, KafkaError):
                return error_message(event)
            self._serve(event)
        return None

    def _serve(self, event: RebalanceEvent) -> None:
        if event.done.done():
            return  # the member gave up waiting (unsubscribe, close): nothing to apply
        try:
            tps = [TopicPartition(t, p) for t, p in event.partitions]
            self._assign_called = False
            self._owned = [] if event.kind != "assign" else list(tps)
            if event.kind == "lost":  # already taken away on the loop; others may own them now: no commit
                callback = self._on_lost or self._on_revoke
                if callback is not None:
                    callback(self, tps)
            elif event.kind == "revoke":
                if self._auto_commit:
                    self._commit_quietly(self._all_positions())
                if self._on_revoke is not None:
                    self._on_revoke(self, tps)
                if not self._assign_called:
                    self._rt.run(self._core.assign([]))
            else:
                if self._on_assign is not None:
                    self._on_assign(self, tps)
                if not self._assign_called:
                    self._rt.run(self._core.assign(tps))
        finally:
            event.complete()

    def _commit_quietly(self, offsets: OffsetMap) -> None:
        if not offsets:
            return
        try:
            self._rt.run(self._core.commit(offsets))
        except KafkaError as exc:
            log.warning("auto-commit before giving partitions up failed: %s", exc)

    # -- assignment ---------------------------------------------------------------------------------------

    def subscribe(self, topics: list[str], on_assign: Callable[..., Any] | None = None,
                  on_revoke: Callable[..., Any] | None = None, on_lost: Callable[..., Any] | None = None) -> None:
        """Join the group (group.id) for `topics` ("^..." names are regular expressions).

        on_assign(consumer, partitions) and on_revoke(consumer, partitions) run inside poll()/consume(),
        on this thread; without a call to assign()/unassign() in them the assignment is applied after.
        """
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost
        self._run(self._core.subscribe(list(topics)))

    def unsubscribe(self) -> None:
        """Give the group's partitions up (auto-commit, on_revoke) and leave the group."""
        self._check_open()
        revoked, self._owned = self._owned, []
        if self._auto_commit:
            self._commit_quietly(self._all_positions())
        if revoked and self._on_revoke is not None:
            self._on_revoke(self, revoked)
        self._run(self._core.unsubscribe())

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Consume exactly these partitions (no group rebalancing); offsets as in confluent-kafka."""
        self._assign_called = True
        self._run(self._core.assign(list(partitions)))

    def unassign(self) -> None:
        self._assign_called = True
        self._run(self._core.assign([]))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """Add partitions to the assignment without touching the positions of the others."""
        self._assign_called = True
        self._run(self._core.incremental_assign(list(partitions)))

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._assign_called = True
        self._run(self._core.incremental_unassign(list(partitions)))

    def seek(self, partition: TopicPartition) -> None:
        """Next poll() returns `partition.offset` (or OFFSET_BEGINNING / OFFSET_END / OFFSET_STORED)."""
        self._run(self._core.seek(partition))

    # -- offsets ------------------------------------------------------------------------------------------

    def commit(self, message: Message | None = None, offsets: list[TopicPartition] | None = None,
               asynchronous: bool = False) -> list[TopicPartition] | None:
        """Commit the message's offset + 1, the given offsets, or every assigned partition's position."""
        self._check_open()
        to_commit = _offsets_to_commit(message, offsets, self._feed.positions)
        if asynchronous:
            future = self._rt.submit(self._core.commit(to_commit))
            future.add_done_callback(_log_commit_failure)
            return None
        self._run(self._core.commit(to_commit))
        return [TopicPartition(t, p, o, m, e) for (t, p), (o, m, e) in to_commit.items()]

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        found = self._run(self._core.committed(tps, _timeout(timeout)))
        out = []
        for t, p in tps:
            c = found.get((t, p))
            offset = c.offset if c is not None and c.offset >= 0 else OFFSET_INVALID
            out.append(TopicPartition(t, p, offset, c.metadata if c else None, c.leader_epoch if c else None))
        return out

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        """(low, high): the log start offset and the high watermark."""
        if cached:
            return self._cached_watermarks(partition)
        tp = (partition.topic, partition.partition)
        timeout = _timeout(timeout)
        low = self._run(self._core.list_offsets({tp: EARLIEST_TIMESTAMP}, timeout, read_committed=False))
        high = self._run(self._core.list_offsets({tp: LATEST_TIMESTAMP}, timeout, read_committed=False))
        return (low[tp].offset, high[tp].offset)

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        """For each partition (its .offset holding a timestamp in ms): the first offset at or after that time,
        -1 when no record is that recent."""
        query = {(tp.topic, tp.partition): tp.offset for tp in partitions}
        found = self._run(self._core.list_offsets(query, _timeout(timeout), read_committed=self._core.read_committed))
        return [TopicPartition(t, p, found[(t, p)].offset, None, found[(t, p)].leader_epoch) for t, p in query]

    def close(self) -> None:
        """Commit (enable.auto.commit), leave the group, stop fetching. Idempotent."""
        if self._closed:
            return
        final = None
        try:
            final = self._all_positions() if self._auto_commit else None
            revoked, self._owned = self._owned, []
            if revoked and self._on_revoke is not None:  # as confluent-kafka: the revoke callback runs on close
                self._on_revoke(self, revoked)
        finally:
            try:
                self._rt.run(self._core.close(final))
            finally:
                self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncConsumer(_Application):
    """The same consumer for asyncio code: `await consumer.poll(1.0)`; the core runs on the caller's loop."""

    async def start(self) -> None:
        await self._core.start()

    async def poll(self, timeout: float | None = None) -> Message | None:
        cur = self._feed.cur
        if cur is not None:
            i = cur.index
            if i < len(cur.records) and cur.version == cur.state.version and cur.cls is not None:
                cur.index = i + 1
                return _new_tuple(cur.cls, cur.records[i])
        self._check_open()
        await self._core.start()
        self._feed.polls += 1
        deadline = _deadline(timeout)
        while True:
            msg = await self._housekeeping() or self._feed.next_message()
            if msg is not None:
                return msg
            left = _left(deadline)
            if left == _DONE:
                return None
            await self._wait(left)

    async def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        self._check_open()
        num_messages = min(num_messages, self._max_poll_records)
        await self._core.start()
        self._feed.polls += 1
        deadline = _deadline(timeout)
        out: list[Message] = []
        while True:
            event = await self._housekeeping(serve_events=not out)  # a batch never spans a rebalance: _Feed.collect
            if event is not None:
                out.append(event)
                return out
            left = self._feed.collect(num_messages, out, deadline)
            if left == _DONE:
                return out
            await self._wait(left)

    async def _wait(self, timeout: float | None) -> None:
        self._feed.waiting = True
        try:
            await self._feed.buffer.wait_async(timeout, self._feed.ready)
        finally:
            self._feed.waiting = False

    async def _housekeeping(self, serve_events: bool = True) -> Message | None:
        """As Consumer._housekeeping."""
        feed = self._feed
        due = self._due_auto_commit()
        if due:
            task = asyncio.get_running_loop().create_task(self._core.commit(due))
            task.add_done_callback(_log_commit_failure)
        while serve_events and feed.group_events:
            event = feed.group_events.popleft()
            if isinstance(event, KafkaError):
                return error_message(event)
            await self._serve(event)
        return None

    async def _serve(self, event: RebalanceEvent) -> None:
        if event.done.done():
            return  # the member gave up waiting (unsubscribe, close): nothing to apply
        try:
            tps = [TopicPartition(t, p) for t, p in event.partitions]
            self._assign_called = False
            self._owned = [] if event.kind != "assign" else list(tps)
            if event.kind == "lost":  # already taken away on the loop; others may own them now: no commit
                await _call(self._on_lost or self._on_revoke, self, tps)
            elif event.kind == "revoke":
                if self._auto_commit:
                    await self._commit_quietly(self._all_positions(), "giving partitions up")
                await _call(self._on_revoke, self, tps)
                if not self._assign_called:
                    await self._core.assign([])
            else:
                await _call(self._on_assign, self, tps)
                if not self._assign_called:
                    await self._core.assign(tps)
        finally:
            event.complete()

    async def _commit_quietly(self, offsets: OffsetMap, before: str) -> None:
        """An auto-commit on the way out of partitions: a failure is logged, the rebalance goes on."""
        if not offsets:
            return
        try:
            await self._core.commit(offsets)
        except KafkaError as exc:
            log.warning("auto-commit before %s failed: %s", before, exc)

    async def subscribe(self, topics: list[str], on_assign: Callable[..., Any] | None = None,
                        on_revoke: Callable[..., Any] | None = None,
                        on_lost: Callable[..., Any] | None = None) -> None:
        """Callbacks may be plain functions or coroutine functions; they get (consumer, partitions)."""
        self._check_open()
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost
        await self._core.subscribe(list(topics))

    async def unsubscribe(self) -> None:
        """Give the group's partitions up (auto-commit, on_revoke) and leave the group."""
        self._check_open()
        revoked, self._owned = self._owned, []
        if self._auto_commit:
            await self._commit_quietly(self._all_positions(), "unsubscribing")
        if revoked:
            await _call(self._on_revoke, self, revoked)
        await self._core.unsubscribe()

    async def assign(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        self._assign_called = True
        await self._core.assign(list(partitions))

    async def unassign(self) -> None:
        self._assign_called = True
        await self._core.assign([])

    async def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._assign_called = True
        await self._core.incremental_assign(list(partitions))

    async def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._assign_called = True
        await self._core.incremental_unassign(list(partitions))

    async def seek(self, partition: TopicPartition) -> None:
        await self._core.seek(partition)

    async def commit(self, message: Message | None = None, offsets: list[TopicPartition] | None = None,
                     asynchronous: bool = False) -> list[TopicPartition] | None:
        self._check_open()
        to_commit = _offsets_to_commit(message, offsets, self._feed.positions)
        if asynchronous:
            task = asyncio.get_running_loop().create_task(self._core.commit(to_commit))
            task.add_done_callback(_log_commit_failure)
            return None
        await self._core.commit(to_commit)
        return [TopicPartition(t, p, o, m, e) for (t, p), (o, m, e) in to_commit.items()]

    async def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        found = await self._core.committed(tps, _timeout(timeout))
        return [TopicPartition(t, p, found[(t, p)].offset if (t, p) in found and found[(t, p)].offset >= 0
                               else OFFSET_INVALID) for t, p in tps]

    async def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                                    cached: bool = False) -> tuple[int, int]:
        if cached:
            return self._cached_watermarks(partition)
        tp = (partition.topic, partition.partition)
        low = await self._core.list_offsets({tp: EARLIEST_TIMESTAMP}, _timeout(timeout), read_committed=False)
        high = await self._core.list_offsets({tp: LATEST_TIMESTAMP}, _timeout(timeout), read_committed=False)
        return (low[tp].offset, high[tp].offset)

    async def offsets_for_times(self, partitions: list[TopicPartition],
                                timeout: float | None = None) -> list[TopicPartition]:
        query = {(tp.topic, tp.partition): tp.offset for tp in partitions}
        found = await self._core.list_offsets(query, _timeout(timeout), read_committed=self._core.read_committed)
        return [TopicPartition(t, p, found[(t, p)].offset, None, found[(t, p)].leader_epoch) for t, p in query]

    async def close(self) -> None:
        if self._closed:
            return
        final = None
        try:
            final = self._all_positions() if self._auto_commit else None
            revoked, self._owned = self._owned, []
            if revoked:
                await _call(self._on_revoke, self, revoked)
        finally:
            try:
                await self._core.close(final)
            finally:
                self._closed = True

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def _call(callback: Callable[..., Any] | None, *args: Any) -> None:
    if callback is None:
        return
    result = callback(*args)
    if inspect.isawaitable(result):
        await result


def _log_commit_failure(future: Any) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is None:
        return
    if isinstance(exc, CommitFailed):
        log.info("asynchronous commit refused: %s", exc)
    else:
        log.warning("asynchronous commit failed: %s", exc)
