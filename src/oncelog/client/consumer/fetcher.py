"""The fetch loop: one Fetch in flight per broker, decoded whole per partition, handed over in chunks.

The loop runs on the client's event loop and keeps each leader busy while the application
works through what was fetched before: a partition is fetched again as soon as fewer than
`MAX_BUFFERED_CHUNKS` of its fetched chunks are waiting, so with two the next response is
usually there when the application finishes the current one (prefetch), and memory stays
bounded by about two fetches per partition.

The hand-over to the application is a `FetchBuffer`: chunks (a partition's decoded records
of one response) and per-partition events (errors, end of partition) in arrival order. The
application side (`Consumer.poll`, possibly on another thread) only ever reads chunks and
writes positions; the loop side only ever writes fetch offsets. Seeks and assignment changes
bump a partition's `version`, which makes every chunk, event and in-flight response of the
older version stale: they are dropped where they are met instead of being searched out.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from oncelog.client.consumer.decode import CorruptRecords, decode_fetch
from oncelog.client.consumer.offsets import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, OffsetClient
from oncelog.client.errors import KafkaError, KafkaTimeoutError, RetriableError, error_for
from oncelog.client.types import Message, error_message
from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey
from oncelog.protocol.client_codecs import FETCH_VERSIONS, decode_fetch_response, encode_fetch_request

log = logging.getLogger(__name__)
_new_tuple = tuple.__new__

TP = tuple[str, int]
MAX_BUFFERED_CHUNKS = 2

# How a partition without a fetch offset gets one.
RESET_COMMITTED = "committed"  # the group's committed offset, else auto.offset.reset
RESET_EARLIEST = "earliest"
RESET_LATEST = "latest"
RESET_ERROR = "error"


class PartitionEOF(KafkaError):
    """confluent-kafka's _PARTITION_EOF event: the consumer reached the end of the partition (enable.partition.eof)."""


class OffsetResetError(KafkaError):
    """No valid offset and auto.offset.reset=error (confluent-kafka's _AUTO_OFFSET_RESET)."""


class PartitionState:
    """One assigned partition. Loop side writes fetch_offset/watermarks; application side writes position."""

    __slots__ = ("topic", "partition", "version", "fetch_offset", "reset", "position", "paused", "in_flight",
                 "chunks_put", "chunks_done", "high_watermark", "last_stable_offset", "log_start_offset",
                 "retry_at", "failed", "eof_at", "leader_epoch")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.version = 0
        self.fetch_offset: int | None = None
        self.reset = RESET_COMMITTED
        self.position: int | None = None  # next offset the application gets; None until known
        self.paused = False
        self.in_flight = False
        # Two counters, one per thread, instead of one shared counter that both would update.
        self.chunks_put = 0
        self.chunks_done = 0
        self.high_watermark = -1001
        self.last_stable_offset = -1001
        self.log_start_offset = -1001
        self.retry_at = 0.0
        self.failed = False
        self.eof_at = -1
        self.leader_epoch: int | None = None

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    def seek(self, offset: int | None, reset: str = RESET_COMMITTED) -> None:
        """New position; everything fetched or in flight for the old one becomes stale. Loop thread only."""
        self.version += 1
        self.fetch_offset = offset
        self.position = offset
        self.reset = reset
        self.failed = False
        self.eof_at = -1
        self.in_flight = False


class Chunk:
    """One partition's records from one Fetch response; consumed in order by the application side.

    Records become Messages only when handed out (see decode.py for why); `cls` is their class
    when the whole chunk has one, which is the usual case and the fast path.
    """

    __slots__ = ("state", "version", "records", "kinds", "cls", "index", "next_offset")

    def __init__(self, state: PartitionState, records: list[tuple], kinds: list[tuple[int, type[Message]]],
                 next_offset: int) -> None:
        self.state = state
        self.version = state.version
        self.records = records
        self.kinds = kinds
        self.cls: type[Message] | None = kinds[0][1] if len(kinds) == 1 else None
        self.index = 0
        self.next_offset = next_offset

    def message(self, i: int) -> Message:
        return _new_tuple(self.cls or self._class_at(i), self.records[i])

    def messages(self, i: int, j: int) -> list[Message]:
        if self.cls is not None:
            return list(map(partial(_new_tuple, self.cls), self.records[i:j]))
        return [self.message(k) for k in range(i, j)]

    def _class_at(self, i: int) -> type[Message]:
        for start, cls in reversed(self.kinds):
            if start <= i:
                return cls
        raise IndexError(i)


class FetchEvent:
    """An error or end-of-partition Message for the application, valid while its partition's version holds."""

    __slots__ = ("state", "version", "message")

    def __init__(self, state: PartitionState, message: Message) -> None:
        self.state = state
        self.version = state.version
        self.message = message


class FetchBuffer:
    """Chunks and events in arrival order, waitable from a thread (sync facade) or the loop (async facade)."""

    def __init__(self) -> None:
        self.items: deque[Chunk | FetchEvent] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def put(self, item: Chunk | FetchEvent) -> None:
        self.items.append(item)
        self.notify()

    def notify(self) -> None:
        """Wake waiters. Called on the loop (fetch results) or from any thread (group events, close)."""
        with self._cond:
            self._cond.notify_all()
        if self._event is not None and self._loop is not None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                self._event.set()
            elif not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._event.set)

    def wait(self, timeout: float | None, ready: Callable[[], bool]) -> bool:
        with self._cond:
            return self._cond.wait_for(ready, timeout)

    async def wait_async(self, timeout: float | None, ready: Callable[[], bool]) -> bool:
        assert self._event is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            self._event.clear()
            if ready():
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(self._event.wait(), left)
            except TimeoutError:
                return ready()
        return True


class Fetcher:
    def __init__(self, cluster: Any, offsets: OffsetClient, config: Any, buffer: FetchBuffer,
                 committed_lookup: Callable[[list[TP]], Any] | None) -> None:
        self._cluster = cluster
        self._offsets = offsets
        self._buffer = buffer
        self._committed_lookup = committed_lookup  # async: partitions -> {tp: committed offset or -1}
        self.states: dict[TP, PartitionState] = {}
        self._read_committed = config["isolation.level"] == "read_committed"
        self._default_reset = config["auto.offset.reset"]
        self._max_wait_ms = config["fetch.wait.max.ms"]
        self._min_bytes = config["fetch.min.bytes"]
        self._max_bytes = config["fetch.max.bytes"]
        self._partition_bytes = config["max.partition.fetch.bytes"]
        self._eof = config["enable.partition.eof"]
        self._request_timeout = config["request.timeout.ms"] / 1000
        self._backoff = config["retry.backoff.ms"] / 1000
        self._check_crcs = True
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = -1
        self._nodes_in_flight: set[int] = set()
        self._tasks: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self._closed = False
        self._metadata_stale = True
        self._metadata_force = False

    # -- control (loop thread) ------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._buffer.bind(self._loop)
        self._task = self._loop.create_task(self._run(), name="oncelog-fetcher")

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        tasks = [t for t in [self._task, *self._tasks] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def assign(self, partitions: Iterable[tuple[TP, int | None, str]]) -> list[PartitionState]:
        """Replace the assignment: (tp, offset or None, reset rule). Kept partitions are repositioned too."""
        new: dict[TP, PartitionState] = {}
        for tp, offset, reset in partitions:
            state = self.states.get(tp) or PartitionState(*tp)
            state.seek(offset, reset)
            new[tp] = state
        for tp, state in self.states.items():
            if tp not in new:
                state.version += 1  # stale: drops its chunks and in-flight data
        self.states = new
        self._metadata_stale = True
        self.wake()
        return list(new.values())

    def add(self, partitions: Iterable[tuple[TP, int | None, str]]) -> None:
        """Add to the assignment; a partition already assigned is repositioned, the others are untouched."""
        new = dict(self.states)
        for tp, offset, reset in partitions:
            state = new.get(tp) or PartitionState(*tp)
            state.seek(offset, reset)
            new[tp] = state
        self.states = new
        self._metadata_stale = True
        self.wake()

    def remove(self, tps: Iterable[TP]) -> None:
        new = dict(self.states)
        for tp in tps:
            state = new.pop(tp, None)
            if state is not None:
                state.version += 1  # stale: drops its chunks and in-flight data
        self.states = new
        self.wake()

    def seek(self, tp: TP, offset: int | None, reset: str) -> None:
        state = self.states.get(tp)
        if state is None:
            raise KafkaError(f"seek: {tp[0]}-{tp[1]} is not assigned")
        state.seek(offset, reset)
        self.wake()

    def wake(self) -> None:
        """Let the loop plan fetches now (after a chunk was consumed, a seek, a resume). Any thread."""
        if self._loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._wake.set()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- the loop -------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closed:
            self._wake.clear()
            try:
                await self._resolve_positions()
                if self._metadata_stale:
                    # After an error the cached answer is what failed: ask the broker again.
                    force, self._metadata_force = self._metadata_force, False
                    self._metadata_stale = False
                    topics = {s.topic for s in self.states.values()}
                    if topics:
                        await self._cluster.refresh_metadata(topics, force=force)
                self._send_fetches()
            except asyncio.CancelledError:
                raise
            except (RetriableError, KafkaTimeoutError) as exc:
                # The broker or coordinator is away for now: keep trying, as the Java consumer does.
                log.info("fetcher: %s; retrying", exc)
                self._stale_metadata()
                await asyncio.sleep(self._backoff)
                continue
            except KafkaError as exc:
                self._fail_all(exc)
            try:
                await asyncio.wait_for(self._wake.wait(), self._next_wakeup())
            except TimeoutError:
                pass

    def _next_wakeup(self) -> float:
        now = time.monotonic()
        waits = [s.retry_at - now for s in self.states.values() if s.retry_at > now]
        return max(0.001, min(waits, default=1.0))

    def _fetchable(self, state: PartitionState, now: float) -> bool:
        return (state.fetch_offset is not None and not state.paused and not state.in_flight and not state.failed
                and state.retry_at <= now and state.chunks_put - state.chunks_done < MAX_BUFFERED_CHUNKS)

    def _send_fetches(self) -> None:
        now = time.monotonic()
        plan: dict[int, list[PartitionState]] = defaultdict(list)
        for state in self.states.values():
            if not self._fetchable(state, now):
                continue
            leader = self._cluster.leader_for(state.topic, state.partition)
            if leader is None or leader < 0:
                self._metadata_stale = True
                state.retry_at = now + self._backoff
                continue
            plan[leader].append(state)
        for node, states in plan.items():
            if node in self._nodes_in_flight:
                continue
            self._nodes_in_flight.add(node)
            for s in states:
                s.in_flight = True
            task = asyncio.get_running_loop().create_task(self._fetch(node, states))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fetch(self, node: int, states: list[PartitionState]) -> None:
        sent = [(s, s.version, s.fetch_offset) for s in states]
        try:
            conn = await self._cluster.connection(node)
            version = conn.api_version(ApiKey.FETCH, FETCH_VERSIONS[1], FETCH_VERSIONS[0])
            topics: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
            for s, _, offset in sent:
                topics[s.topic].append((s.partition, offset, self._partition_bytes))
            body = encode_fetch_request(version, max_wait_ms=self._max_wait_ms, min_bytes=self._min_bytes,
                                        max_bytes=self._max_bytes,
                                        isolation_level=1 if self._read_committed else 0,
                                        topics=list(topics.items()))
            frame = await conn.request(ApiKey.FETCH, version, body,
                                       timeout=self._request_timeout + self._max_wait_ms / 1000)
            result = decode_fetch_response(version, frame)
            if result.error_code:
                raise error_for(result.error_code) or KafkaError("Fetch failed", result.error_code)
            by_tp = {(name, p.partition): p for name, parts in result.topics for p in parts}
            for state, version_sent, offset in sent:
                state_version_ok = state.version == version_sent
                if state_version_ok:
                    state.in_flight = False
                fp = by_tp.get(state.tp)
                if fp is None or not state_version_ok or self.states.get(state.tp) is not state:
                    continue
                self._handle_partition(state, offset, fp)
        except asyncio.CancelledError:
            raise
        except RetriableError as exc:  # NetworkError and RequestTimedOut included
            log.info("fetch from node %d failed: %s; retrying", node, exc)
            self._stale_metadata()
            for state, version_sent, _ in sent:
                if state.version == version_sent:
                    state.in_flight = False
                    state.retry_at = time.monotonic() + self._backoff
        except KafkaError as exc:
            for state, version_sent, _ in sent:
                if state.version == version_sent:
                    state.in_flight = False
                    self._fail(state, exc)
        finally:
            self._nodes_in_flight.discard(node)
            self._wake.set()

    def _handle_partition(self, state: PartitionState, offset: int, fp: Any) -> None:
        code = fp.error_code
        if code == ErrorCode.NONE:
            state.high_watermark = fp.high_watermark
            if fp.last_stable_offset >= 0:
                state.last_stable_offset = fp.last_stable_offset
            if fp.log_start_offset >= 0:
                state.log_start_offset = fp.log_start_offset
            try:
                decoded = decode_fetch(state.topic, state.partition, fp.records, offset,
                                       read_committed=self._read_committed, aborted=fp.aborted_transactions,
                                       check_crcs=self._check_crcs)
            except CorruptRecords as exc:
                self._fail(state, KafkaError(str(exc), ErrorCode.CORRUPT_MESSAGE))
                return
            state.fetch_offset = decoded.next_offset
            if decoded.records or decoded.next_offset != offset:
                state.chunks_put += 1
                self._buffer.put(Chunk(state, decoded.records, decoded.kinds, decoded.next_offset))
            end = fp.last_stable_offset if self._read_committed and fp.last_stable_offset >= 0 else fp.high_watermark
            if self._eof and decoded.next_offset >= end and state.eof_at != decoded.next_offset:
                state.eof_at = decoded.next_offset
                self._buffer.put(FetchEvent(state, error_message(
                    PartitionEOF(f"reached end of {state.topic} [{state.partition}] at offset {decoded.next_offset}",
                                 None),
                    state.topic, state.partition, decoded.next_offset)))
            return
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            reset = self._default_reset
            if reset == RESET_ERROR:
                self._fail(state, OffsetResetError(
                    f"fetch offset {offset} is out of range for {state.topic} [{state.partition}] "
                    "and auto.offset.reset is error", code))
                return
            state.fetch_offset = None
            state.reset = reset
            return
        err = error_for(code) or KafkaError("Fetch failed", code)
        if err.retriable:
            self._stale_metadata()
            state.retry_at = time.monotonic() + self._backoff
            return
        self._fail(state, err)

    def _stale_metadata(self) -> None:
        self._metadata_stale = True
        self._metadata_force = True

    def _fail(self, state: PartitionState, error: KafkaError) -> None:
        """Stop fetching the partition and tell the application; a seek starts it again."""
        state.failed = True
        self._buffer.put(FetchEvent(state, error_message(error, state.topic, state.partition,
                                                         state.fetch_offset if state.fetch_offset is not None
                                                         else -1001)))

    def _fail_all(self, error: KafkaError) -> None:
        for state in self.states.values():
            if state.fetch_offset is None and not state.failed:
                self._fail(state, error)

    # -- positions ------------------------------------------------------------------------------------

    async def _resolve_positions(self) -> None:
        """Give every partition without a fetch offset one: committed offset, else auto.offset.reset."""
        missing = [s for s in self.states.values() if s.fetch_offset is None and not s.failed]
        if not missing:
            return
        versions = {s.tp: s.version for s in missing}
        committed_rule = [s for s in missing if s.reset == RESET_COMMITTED]
        found: dict[TP, int] = {}
        if committed_rule and self._committed_lookup is not None:
            found = await self._committed_lookup([s.tp for s in committed_rule])
        resets: dict[TP, int] = {}
        for state in missing:
            offset = found.get(state.tp, -1)
            if offset >= 0:
                self._set_offset(state, versions[state.tp], offset)
                continue
            rule = self._default_reset if state.reset == RESET_COMMITTED else state.reset
            if rule == RESET_ERROR:
                self._fail(state, OffsetResetError(
                    f"no committed offset for {state.topic} [{state.partition}] and auto.offset.reset is error"))
                continue
            resets[state.tp] = EARLIEST_TIMESTAMP if rule == RESET_EARLIEST else LATEST_TIMESTAMP
        if resets:
            listed = await self._offsets.list_offsets(resets, read_committed=self._read_committed,
                                                      timeout=self._request_timeout)
            for tp, lo in listed.items():
                state = self.states.get(tp)
                if state is not None:
                    self._set_offset(state, versions[tp], lo.offset)

    def _set_offset(self, state: PartitionState, version: int, offset: int) -> None:
        if state.version != version or self.states.get(state.tp) is not state or state.fetch_offset is not None:
            return  # a seek or reassignment came first
        state.fetch_offset = offset
        state.position = offset
