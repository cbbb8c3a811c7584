"""Followers fetch (docs/cluster.md §4.2-§4.4): one asyncio fetch loop per source broker.

Every partition this broker follows on one leader is fetched in one Fetch request (v12) over an oncelog client
connection: `replica_id` = our node id, each partition's CurrentLeaderEpoch, LastFetchedEpoch and log start
offset, and as fetch offset its log end, which is durable by construction: after appending a response's batches
(as they are, `Partition.append_replicated`) the loop waits until the group-commit flush covered them, and only
then sends the next Fetch (§4.3). The leader reads each follower's fetch offset as "fsynced up to here".

A partition is never truncated by high watermark alone (KIP-101, KIP-279, KIP-320). Every fetch names the epoch
of its last batch (LastFetchedEpoch); a leader whose log diverges from it answers DivergingEpoch (the end of that
epoch on the leader) instead of records, and the partition cuts its log there at once, with no
OffsetsForLeaderEpoch round trip at a leader change. When the leader answers an epoch this log does not have,
the partition cuts to the end of its own older epoch and asks again with OffsetsForLeaderEpoch, repeating while
the answer is an epoch it does not know (KIP-279). A log with no leader epochs at all keeps what it knows to be
committed (its high watermark).
A fetch offset outside the leader's log (OFFSET_OUT_OF_RANGE) is resolved with ListOffsets: below the leader's
log start the log starts over there; above the leader's log end it is cut to it.

A partition whose log started over (fetched below the leader's log start, so emptied and started at it; or one
that did and was not finished when this broker stopped: `Partition.producer_state_incomplete`) lacks the
producers whose batches were deleted before it copied the log (seed 000). It asks its leader for its
producer-state snapshot (FetchSnapshot, on a connection of its own, since the leader answers only once the
snapshot's offset L is committed and the other partitions' fetches must not queue behind it), is not fetched
until the answer comes, then fetches up to exactly L, installs the state there (`Partition.install_producer_state`)
and only then fetches past it: a fetch offset past L tells the leader it may join the ISR (docs/cluster.md §4.7).

Errors back one partition off for replica.fetch.backoff.ms; a broken connection backs the whole loop off. The
replica manager decides who is followed at which epoch (`follow` / `unfollow`); a response that arrives after
that changed is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..client.connection import BrokerConnection
from ..client.errors import KafkaError as ClientError
from ..errors import ErrorCode, KafkaError
from ..protocol import client_codecs as codecs
from ..protocol.apis import ApiKey
from ..protocol.fetch_codec import encode_replica_state_tag
from ..records.batch import HEADER_SIZE, crc_ok, read_header
from ..storage.leader_epochs import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from ..storage.log_manager import LogManager
    from ..storage.partition import Partition
    from .metadata_image import MetadataImage
    from .replica_manager import ReplicaManager

log = logging.getLogger(__name__)

Key = tuple[str, int]
FETCH_VERSION = 12  # the newest Fetch oncelog's codecs speak; names topics, carries LastFetchedEpoch
FETCH_SNAPSHOT_VERSION = 0
EARLIEST, LATEST = -2, -1


@dataclass(frozen=True, slots=True)
class LeaderSnapshot:
    """The leader's producer state (snapshot format) as of its log end offset `offset`, committed there."""

    data: bytes
    offset: int


@dataclass(eq=False, slots=True)
class FetchPartition:
    """One followed partition: whom it follows at which epoch, and where it stands."""

    key: Key
    part: Partition
    leader: int
    leader_epoch: int
    truncating: bool = False  # validate the log with OffsetsForLeaderEpoch before fetching (KIP-279's repeat)
    out_of_range: bool = False  # the leader said the fetch offset is outside its log
    delay_until: float = 0.0  # monotonic time before which it is not fetched (backoff)
    needs_snapshot: bool = False  # the log started over: the leader's producer state is to be installed
    snapshot: LeaderSnapshot | None = None  # received, installed when the log end reaches its offset


def _monotonic() -> float:
    return time.monotonic()


def _with_replica_state(body: bytes, node_id: int, broker_epoch: int) -> bytes:
    """Put our broker epoch in the request (Fetch v15's ReplicaState, tag 1, which Kafka's v12 schema lacks and
    would skip), so a leader refuses the fetches of a stale incarnation of this broker (STALE_BROKER_EPOCH)."""
    if broker_epoch < 0:
        return body
    assert body[-1:] == b"\x00", "a flexible request ends with its (empty) top-level tagged fields"
    return body[:-1] + encode_replica_state_tag(node_id, broker_epoch)


class ReplicaFetcherManager:
    """Implements `replica_manager.FollowerFetchers`: a `SourceFetcher` per leader broker, created on demand."""

    def __init__(self, node_id: int, image: MetadataImage, logs: LogManager, replicas: ReplicaManager,
                 config: BrokerConfig, *, broker_epoch: Callable[[], int] = lambda: -1,
                 now_ms: Callable[[], int] | None = None, security: Any = None) -> None:
        self.node_id = node_id
        self.security = security  # client.security.Security of the inter-broker listener (None: PLAINTEXT)
        self.image = image
        self.logs = logs
        self.replicas = replicas
        self.config = config
        self.broker_epoch = broker_epoch
        self.now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.sources: dict[int, SourceFetcher] = {}
        self._where: dict[Key, int] = {}  # partition -> the leader it is fetched from
        self._stopped = False

    def follow(self, key: Key, part: Partition, leader: int, leader_epoch: int) -> None:
        if self._stopped:
            return
        self.unfollow(key)
        source = self.sources.get(leader)
        if source is None:
            source = self.sources[leader] = SourceFetcher(self, leader)
            source.start()
        # A log with leader epochs is validated by the leader's DivergingEpoch answers to its fetches; one without
        # is cut to its high watermark first (`_truncate`). One waiting for the leader's producer state is not
        # fetched until it has it, so it is validated with OffsetsForLeaderEpoch first: the state is installed
        # at its offset only on a log that agrees with the leader's below it.
        incomplete = part.producer_state_incomplete
        source.add(FetchPartition(key, part, leader, leader_epoch,
                                  truncating=incomplete or part.leader_epochs.latest_epoch == UNDEFINED_EPOCH,
                                  needs_snapshot=incomplete))
        self._where[key] = leader

    def unfollow(self, key: Key) -> None:
        leader = self._where.pop(key, None)
        if leader is not None and leader in self.sources:
            self.sources[leader].remove(key)

    def following(self, key: Key) -> FetchPartition | None:
        leader = self._where.get(key)
        return None if leader is None else self.sources[leader].partitions.get(key)

    async def stop(self) -> None:
        self._stopped = True
        self._where.clear()
        sources, self.sources = list(self.sources.values()), {}
        await asyncio.gather(*(s.stop() for s in sources), return_exceptions=True)

    def _retire(self, source: SourceFetcher) -> None:
        if self.sources.get(source.leader) is source:
            del self.sources[source.leader]


class SourceFetcher:
    """The fetch loop for every partition followed on one leader broker."""

    def __init__(self, manager: ReplicaFetcherManager, leader: int) -> None:
        self.manager = manager
        self.leader = leader
        self.partitions: dict[Key, FetchPartition] = {}
        self._changed = asyncio.Event()
        self._conn: BrokerConnection | None = None
        self._address: tuple[str, int] | None = None
        self._task: asyncio.Task | None = None
        self._snapshot_conn: BrokerConnection | None = None  # FetchSnapshot only: its answers wait on the leader
        self._snapshot_task: asyncio.Task | None = None
        config = manager.config
        self._backoff = config["replica.fetch.backoff.ms"] / 1000
        self._max_wait_ms: int = config["replica.fetch.wait.max.ms"]
        self._partition_max: int = config["replica.fetch.max.bytes"]
        self._response_max: int = config["replica.fetch.response.max.bytes"]
        self._timeout_ms: int = config["replica.socket.timeout.ms"]
        self.fetches = 0  # fetch round trips made (tests and metrics)
        self.errors: Counter[int] = Counter()  # partition error codes answered, by code

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"oncelog-fetch-from-{self.leader}")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._snapshot_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._close()

    def add(self, fp: FetchPartition) -> None:
        self.partitions[fp.key] = fp
        self._changed.set()

    def remove(self, key: Key) -> None:
        self.partitions.pop(key, None)
        self._changed.set()

    # -- the loop ----------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        name = f"fetcher of broker {self.manager.node_id} from {self.leader}"
        try:
            while self.partitions:
                self._changed.clear()
                try:
                    conn = await self._connection()
                    if conn is None:
                        await self._pause(self._backoff)
                        continue
                    await self._resolve_out_of_range(conn)
                    await self._truncate(conn)
                    self._request_snapshots()
                    ready = self._ready()
                    if not ready:
                        await self._pause(self._next_delay())
                        continue
                    await self._fetch(conn, ready)
                except asyncio.CancelledError:
                    raise
                except (ClientError, OSError) as exc:
                    log.warning("%s: %s; retrying in %.1f s", name, exc, self._backoff)
                    await self._close()
                    await self._pause(self._backoff)
                except Exception:
                    log.exception("%s failed; retrying in %.1f s", name, self._backoff)
                    await self._close()
                    await self._pause(self._backoff)
        finally:
            self.manager._retire(self)
            if self._snapshot_task is not None:
                self._snapshot_task.cancel()
            await self._close()

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake when the partitions change (a new epoch, a new partition to follow, a snapshot)."""
        try:
            async with asyncio.timeout(max(seconds, 0.0)):
                await self._changed.wait()
        except TimeoutError:
            pass

    def _ready(self) -> list[FetchPartition]:
        """Partitions to fetch now. One whose log end is not yet durable is left out: its fetch offset would
        report what a power loss could take back (§4.3); so is one waiting for its leader's producer state."""
        now = _monotonic()
        return [fp for fp in self.partitions.values()
                if not fp.truncating and not fp.out_of_range and fp.delay_until <= now
                and (not fp.needs_snapshot or fp.snapshot is not None)
                and fp.part.log.durable_end >= fp.part.log.log_end_offset]

    def _next_delay(self) -> float:
        now = _monotonic()
        waits = [fp.delay_until - now for fp in self.partitions.values() if fp.delay_until > now]
        return min(waits) if waits else self._backoff

    def _back_off(self, fp: FetchPartition) -> None:
        fp.delay_until = _monotonic() + self._backoff

    def _current(self, fp: FetchPartition) -> bool:
        """Still followed as when the request went out (the replica manager may have moved it meanwhile)."""
        return self.partitions.get(fp.key) is fp and self.manager.replicas.is_following(
            fp.key, fp.leader, fp.leader_epoch)

    # -- connection --------------------------------------------------------------------------------------------
    async def _connection(self) -> BrokerConnection | None:
        info = self.manager.image.brokers.get(self.leader)
        if info is None:
            return None  # not registered (dead, or restarting): the image tells us when it is back
        address = (info.host, info.port)
        if self._conn is not None and not self._conn.closed and self._address == address:
            return self._conn
        await self._close()
        conn = BrokerConnection(info.host, info.port, self.leader,
                                client_id=f"oncelog-replica-{self.manager.node_id}",
                                request_timeout_ms=self._timeout_ms, connect_timeout_ms=self._timeout_ms,
                                security=self.manager.security)
        await conn.connect()
        self._conn, self._address = conn, address
        return conn

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        snapshots, self._snapshot_conn = self._snapshot_conn, None
        for c in (conn, snapshots):
            if c is not None:
                await c.close()

    # -- truncation (KIP-101 / KIP-279) ------------------------------------------------------------------------
    async def _truncate(self, conn: BrokerConnection) -> None:
        now = _monotonic()
        pending = [fp for fp in self.partitions.values() if fp.truncating and fp.delay_until <= now]
        asking: list[tuple[FetchPartition, int]] = []
        for fp in pending:
            epoch = fp.part.leader_epochs.latest_epoch
            if epoch == UNDEFINED_EPOCH:
                # No leader epochs known here: an empty log, or one written before epochs were kept. Only what
                # this replica knows to be committed (its high watermark) is safe to keep.
                self._truncate_to(fp, fp.part.log.high_watermark)
                fp.truncating = False
            else:
                asking.append((fp, epoch))
        if not asking:
            return
        topics: dict[str, list[dict[str, int]]] = {}
        for fp, epoch in asking:
            topics.setdefault(fp.key[0], []).append(
                {"partition": fp.key[1], "current_leader_epoch": fp.leader_epoch, "leader_epoch": epoch})
        version = conn.api_version(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, 3)
        resp = await conn.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, {
            "replica_id": self.manager.node_id,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        }, version=version)
        answers = {(t.topic, p.partition): p for t in resp.topics for p in t.partitions}
        for fp, epoch in asking:
            answer = answers.get(fp.key)
            if not self._current(fp):
                continue
            if answer is None or answer.error_code:
                code = -1 if answer is None else answer.error_code
                log.info("%s-%d: OffsetsForLeaderEpoch(%d) on broker %d: error %s; retrying", *fp.key, epoch,
                         self.leader, code)
                self._back_off(fp)
                continue
            target, done = self._truncation_point(fp, answer.leader_epoch, answer.end_offset)
            self._truncate_to(fp, target)
            fp.truncating = not done

    def _truncation_point(self, fp: FetchPartition, leader_epoch: int, end_offset: int) -> tuple[int, bool]:
        """Where to cut, and whether that settles it (Kafka's AbstractFetcherThread.getOffsetTruncationState)."""
        plog = fp.part.log
        end = plog.log_end_offset
        if end_offset == UNDEFINED_EPOCH_OFFSET:
            return plog.high_watermark, True  # the leader knows none of our epochs: keep what was committed
        if leader_epoch == UNDEFINED_EPOCH:
            return min(end_offset, end), True
        epoch, own_end = fp.part.leader_epochs.end_offset_for(leader_epoch, end)
        if own_end == UNDEFINED_EPOCH_OFFSET:
            return min(end_offset, end), True
        if epoch != leader_epoch:
            # We do not have the epoch the leader answered with: cut to where our older epoch ends, ask again.
            return min(own_end, end), False
        return min(own_end, end_offset, end), True

    def _truncate_to(self, fp: FetchPartition, offset: int) -> None:
        plog = fp.part.log
        if offset >= plog.log_end_offset:
            # Nothing to cut, but an epoch this broker started as leader at its log end and wrote nothing in stays
            # the latest one it names in fetches, and the leader, which never had it, answers DivergingEpoch at
            # this same offset again and again. Drop it, as Kafka's UnifiedLog.truncateTo does.
            fp.part.leader_epochs.truncate_from_end(plog.log_end_offset)
            return
        topic, index = fp.key
        before = plog.log_end_offset
        try:
            self.manager.logs.truncate_to(topic, index, max(offset, 0))
        except KafkaError as exc:
            log.error("%s-%d: truncation to %d failed: %s", topic, index, offset, exc)
            self._back_off(fp)
            return
        log.info("%s-%d: truncated from %d to %d following broker %d at epoch %d", topic, index, before,
                 plog.log_end_offset, self.leader, fp.leader_epoch)

    # -- the leader's producer state (seed 000) -------------------------------------------------------------------
    def _request_snapshots(self) -> None:
        """Ask for the producer state of every partition that needs it and has been truncated, one request at a
        time in the background; its end wakes the loop."""
        if self._snapshot_task is not None:
            return
        now = _monotonic()
        wanted = [fp for fp in self.partitions.values() if fp.needs_snapshot and fp.snapshot is None
                  and not fp.truncating and not fp.out_of_range and fp.delay_until <= now]
        if wanted:
            self._snapshot_task = asyncio.get_running_loop().create_task(
                self._fetch_snapshots(wanted), name=f"oncelog-snapshots-from-{self.leader}")

    async def _fetch_snapshots(self, wanted: list[FetchPartition]) -> None:
        try:
            topics: dict[str, list[dict[str, Any]]] = {}
            for fp in wanted:
                topics.setdefault(fp.key[0], []).append({
                    "partition": fp.key[1], "current_leader_epoch": fp.leader_epoch,
                    "snapshot_id": {"end_offset": -1, "epoch": -1}, "position": 0})
            try:
                conn = self._snapshot_conn
                if conn is None or conn.closed:
                    info = self.manager.image.brokers.get(self.leader)
                    if info is None:
                        raise ClientError(f"broker {self.leader} is not registered")
                    conn = BrokerConnection(info.host, info.port, self.leader,
                                            client_id=f"oncelog-replica-{self.manager.node_id}-snapshots",
                                            request_timeout_ms=self._timeout_ms,
                                            connect_timeout_ms=self._timeout_ms, security=self.manager.security)
                    await conn.connect()
                    self._snapshot_conn = conn
                resp = await conn.call(ApiKey.FETCH_SNAPSHOT, {
                    "replica_id": self.manager.node_id, "max_bytes": 0x7FFFFFFF,
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
                }, version=FETCH_SNAPSHOT_VERSION)
            except (ClientError, OSError) as exc:
                log.warning("producer state from broker %d for %s: %s; retrying", self.leader,
                            [fp.key for fp in wanted], exc)
                conn, self._snapshot_conn = self._snapshot_conn, None
                if conn is not None:
                    await conn.close()
                for fp in wanted:
                    self._back_off(fp)
                return
            answers = {(t.name, p.index): p for t in resp.topics for p in t.partitions}
            for fp in wanted:
                answer = answers.get(fp.key)
                if not self._current(fp) or not fp.needs_snapshot or fp.snapshot is not None:
                    continue
                self._take_snapshot(fp, answer)
        except Exception:
            log.exception("producer state from broker %d failed", self.leader)
            for fp in wanted:
                self._back_off(fp)
        finally:
            self._snapshot_task = None
            self._changed.set()

    def _take_snapshot(self, fp: FetchPartition, answer: Any) -> None:
        topic, index = fp.key
        code = -1 if answer is None else answer.error_code
        if code:
            self.errors[code] += 1
            log.info("%s-%d: producer state from broker %d: error %d; retrying", topic, index, self.leader, code)
            self._back_off(fp)
            return
        data = bytes(answer.unaligned_records or b"")
        offset = answer.snapshot_id.end_offset
        if answer.position != 0 or answer.size != len(data) or offset < 0:
            log.error("%s-%d: producer state from broker %d arrived incomplete (offset %d, %d of %d bytes from %d)",
                      topic, index, self.leader, offset, len(data), answer.size, answer.position)
            self._back_off(fp)
            return
        fp.snapshot = LeaderSnapshot(data, offset)
        log.info("%s-%d: producer state at offset %d from broker %d (%d bytes); log end %d", topic, index,
                 offset, self.leader, len(data), fp.part.log.log_end_offset)
        self._install_if_reached(fp)

    def _install_if_reached(self, fp: FetchPartition, next_base: int | None = None) -> None:
        """Install the leader's producer state once this log ends exactly at its offset (not before: the batches
        up to it would then be counted twice; not after: this replica's own replay would then decide).

        `next_base` is the base offset of the leader's next batch after this log's end, when a fetch brought
        one. At or past the state's offset L while this log ends below L, the leader has no batch in between
        (its cleaner removed them: docs/log-cleaner.md §6), so the state of L is this log's state at its end and
        is installed there."""
        snap = fp.snapshot
        if snap is None:
            return
        topic, index = fp.key
        plog = fp.part.log
        if snap.offset < plog.log_start_offset:
            # The leader deleted past it meanwhile and this log started over above it: ask again.
            log.info("%s-%d: producer state at %d is below the log start %d; asking again", topic, index,
                     snap.offset, plog.log_start_offset)
            fp.snapshot = None
            self._back_off(fp)
            return
        if plog.log_end_offset > snap.offset:
            # Longer than the leader's log was when it took the state (validated, this log cannot be): validate
            # it again and ask again.
            log.warning("%s-%d: log end %d above the producer state's offset %d; validating the log again", topic,
                        index, plog.log_end_offset, snap.offset)
            fp.snapshot, fp.truncating = None, True
            self._back_off(fp)
            return
        at = snap.offset
        if plog.log_end_offset != snap.offset:
            if next_base is None or not plog.log_end_offset < snap.offset <= next_base:
                return  # fetched up to it first
            at = plog.log_end_offset
        try:
            fp.part.install_producer_state(snap.data, at)
        except (ValueError, KafkaError, OSError) as exc:
            log.error("%s-%d: installing the producer state of broker %d at %d failed: %s", topic, index,
                      self.leader, snap.offset, exc)
            fp.snapshot = None
            self._back_off(fp)
            return
        fp.snapshot, fp.needs_snapshot = None, False
        log.info("%s-%d: installed the producer state of broker %d at offset %d (%d producers)", topic, index,
                 self.leader, snap.offset, len(fp.part.producers.entries))

    # -- out of range ----------------------------------------------------------------------------------------------
    async def _resolve_out_of_range(self, conn: BrokerConnection) -> None:
        pending = [fp for fp in self.partitions.values() if fp.out_of_range and fp.delay_until <= _monotonic()]
        for fp in pending:
            topic, index = fp.key
            start = await self._leader_offset(conn, fp, EARLIEST)
            end = await self._leader_offset(conn, fp, LATEST)
            if start is None or end is None or not self._current(fp):
                self._back_off(fp)
                continue
            plog = fp.part.log
            if plog.log_end_offset < start:
                # Everything we have is below what the leader still keeps: start over at its log start.
                log.info("%s-%d: log end %d below the leader's log start %d: starting over there", topic, index,
                         plog.log_end_offset, start)
                self.manager.logs.truncate_fully_and_start_at(topic, index, start)
                # The producers whose batches were before `start` are not here: the leader's state is needed.
                fp.needs_snapshot = True
                if fp.snapshot is not None and fp.snapshot.offset < start:
                    fp.snapshot = None
                elif fp.snapshot is not None:
                    # A state already here for exactly this start goes in now, before the next fetch from `start`
                    # could count this replica as caught up without it.
                    self._install_if_reached(fp)
            elif plog.log_end_offset > end:
                self._truncate_to(fp, end)
            fp.out_of_range = False

    async def _leader_offset(self, conn: BrokerConnection, fp: FetchPartition, which: int) -> int | None:
        topic, index = fp.key
        resp = await conn.call(ApiKey.LIST_OFFSETS, {
            "replica_id": self.manager.node_id, "isolation_level": 0,
            "topics": [{"name": topic, "partitions": [
                {"partition_index": index, "current_leader_epoch": fp.leader_epoch, "timestamp": which}]}],
        }, version=conn.api_version(ApiKey.LIST_OFFSETS, 7, 4))
        for t in resp.topics:
            for p in t.partitions:
                if p.partition_index == index and p.error_code == 0:
                    return p.offset
        return None

    # -- fetching ----------------------------------------------------------------------------------------------
    async def _fetch(self, conn: BrokerConnection, ready: list[FetchPartition]) -> None:
        replicas = self.manager.replicas
        topics: dict[str, list[dict[str, int]]] = {}
        for fp in ready:
            plog = fp.part.log
            topics.setdefault(fp.key[0], []).append({
                "partition": fp.key[1], "current_leader_epoch": fp.leader_epoch,
                "fetch_offset": plog.log_end_offset, "last_fetched_epoch": fp.part.leader_epochs.latest_epoch,
                "log_start_offset": plog.log_start_offset, "partition_max_bytes": self._partition_max,
            })
        body = _with_replica_state(codecs.encode_request(ApiKey.FETCH, FETCH_VERSION, {
            "replica_id": self.manager.node_id, "max_wait_ms": self._max_wait_ms, "min_bytes": 1,
            "max_bytes": self._response_max, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
            "forgotten_topics_data": [], "rack_id": "",
        }), self.manager.node_id, self.manager.broker_epoch())
        frame = await conn.request(ApiKey.FETCH, FETCH_VERSION, body,
                                   timeout=(self._timeout_ms + self._max_wait_ms) / 1000)
        assert frame is not None
        result = codecs.decode_fetch_response(FETCH_VERSION, frame)
        self.fetches += 1
        if result.error_code:
            log.warning("fetch from broker %d: error %d", self.leader, result.error_code)
            for fp in ready:
                self._back_off(fp)
            return
        sent = {fp.key: fp for fp in ready}
        appended = []
        for topic, partitions in result.topics:
            for p in partitions:
                fp = sent.get((topic, p.partition))
                if fp is None or not self._current(fp):
                    continue
                if self._apply(fp, p):
                    appended.append(fp)
        if appended:
            # The next fetch reports these offsets as durable: wait for the flush round that covers them. Bounded,
            # in case a log goes away meanwhile; a partition still not durable then sits out (see _ready).
            try:
                async with asyncio.timeout(self._timeout_ms / 1000):
                    await asyncio.gather(*(
                        replicas.wait_durable(fp.part.log, fp.part.log.log_end_offset) for fp in appended))
            except TimeoutError:
                log.warning("fetch from broker %d: flush of %s not done in %d ms", self.leader,
                            [fp.key for fp in appended if fp.part.log.durable_end < fp.part.log.log_end_offset],
                            self._timeout_ms)

    def _apply(self, fp: FetchPartition, p: Any) -> bool:
        """One partition of a fetch response; True if batches were appended."""
        topic, index = fp.key
        code = p.error_code
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            fp.out_of_range = True
            return False
        if code:
            self.errors[code] += 1
            if code == ErrorCode.STALE_BROKER_EPOCH:
                log.warning("%s-%d: broker %d refuses our fetches as from a stale incarnation (broker epoch %d)",
                            topic, index, self.leader, self.manager.broker_epoch())
            elif code not in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                              ErrorCode.UNKNOWN_LEADER_EPOCH):
                log.info("%s-%d: fetch from broker %d answered error %d", topic, index, self.leader, code)
            self._back_off(fp)  # a stale or future epoch resolves through the image; anything else, retry
            return False
        part = fp.part
        plog = part.log
        if p.diverging_epoch is not None:
            # KIP-320: the leader's log and ours part at the end of this epoch: cut there (or, for an epoch we
            # never had, at the end of our own older one, then ask again with OffsetsForLeaderEpoch).
            epoch, end_offset = p.diverging_epoch
            target, done = self._truncation_point(fp, epoch, end_offset)
            log.info("%s-%d: our log diverges from broker %d's (its epoch %d ends at %d); cutting to %d", topic,
                     index, self.leader, epoch, end_offset, target)
            self._truncate_to(fp, target)
            fp.truncating = not done
            return False
        appended = False
        records = p.records
        if records.nbytes >= HEADER_SIZE:
            buf = bytearray(records)  # writable: the log writes the (same) base offset into the batch
            view = memoryview(buf)
            pos, size_all = 0, len(buf)
            now = self.manager.now_ms()
            try:
                while size_all - pos >= HEADER_SIZE:
                    header = read_header(buf, pos)
                    size = header.size
                    if size > size_all - pos:
                        break  # a partial batch at the end: fetched whole next time
                    if header.next_offset <= plog.log_end_offset:
                        pos += size  # already here (the read began at the batch containing the offset)
                        continue
                    snap = fp.snapshot
                    if snap is not None:
                        if header.base_offset < snap.offset < header.next_offset:
                            log.error("%s-%d: batch %d-%d from broker %d spans the offset %d of its producer "
                                      "state; asking for it again", topic, index, header.base_offset,
                                      header.next_offset - 1, self.leader, snap.offset)
                            fp.snapshot = None
                            self._back_off(fp)
                            break
                        if plog.log_end_offset == snap.offset or (
                                plog.log_end_offset < snap.offset <= header.base_offset):
                            self._install_if_reached(fp, header.base_offset)  # before the batches after it
                            if fp.needs_snapshot:
                                break  # not installed: nothing goes past it
                    if header.magic != 2 or not crc_ok(buf, pos, header):
                        raise KafkaError(ErrorCode.CORRUPT_MESSAGE,
                                         f"{topic}-{index}: corrupt batch at {header.base_offset} from broker "
                                         f"{self.leader}")
                    part.append_replicated(view[pos:pos + size], header, now)
                    appended = True
                    pos += size
            except KafkaError as exc:
                log.error("%s-%d: appending replicated batches failed: %s", topic, index, exc)
                if exc.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    fp.truncating = True  # the leader's log and ours disagree: validate again
                self._back_off(fp)
        if fp.snapshot is not None:
            self._install_if_reached(fp)
        if p.log_start_offset > plog.log_start_offset:
            try:
                # Checkpointed before the next fetch reports it (§4.7).
                self.manager.logs.advance_log_start(topic, index, p.log_start_offset)
            except KafkaError as exc:
                log.error("%s-%d: following the leader's log start %d failed: %s", topic, index,
                          p.log_start_offset, exc)
        self.manager.replicas.follower_progress(fp.key, p.high_watermark)
        return appended
