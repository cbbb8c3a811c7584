"""Partition roles on this broker, and everything a replicated leader decides (docs/cluster.md §4).

The metadata image says, for each partition with a replica here, who leads and at which leader epoch. The replica
manager applies it: a partition led here at a newer epoch becomes a leader (its leader-epoch cache gets
(epoch, log end offset), its batches are stamped with that epoch, follower tracking starts from the state's ISR);
a partition led elsewhere becomes a follower of that leader (the fetcher truncates it and fetches); a partition
no longer assigned here stops, and its copy is deleted once its topic is being deleted or a reassignment moved it.

As leader it tracks each follower's fetch offset, which is a durable offset by construction (a follower sends its
next fetch only after its group-commit flush covered what it appended, §4.3), and the last time the follower was
caught up (Kafka's lastCaughtUpTimeMs). From them:

- high watermark = min(own durable end, fetch offset of every other ISR member); it only moves up;
- acks=all completes when the high watermark passes the write, while the ZooKeeper lease is valid (§5.4), with
  NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR fell below min.insync.replicas meanwhile (§4.6);
- the ISR shrinks when a follower was not caught up for replica.lag.time.max.ms and expands when a follower
  reaches the high watermark and the start of the current epoch (§4.5): both a CAS on the state znode through the
  metadata store; a failed CAS means someone else wrote, and the watch brings what they wrote;
- the log start offset clients are told is the minimum over the ISR's persisted log starts (§4.7);
- a follower whose log started over (it fetched below the log start) lacks the producers whose batches were
  deleted: it takes this leader's producer-state snapshot (`producer_snapshot`, served only once the offset it
  describes is committed) and joins the ISR only once its fetch offset passed that offset, i.e. after it
  installed it (§4.7). One that was in the ISR leaves it at once.

Runs on the event loop; the image calls `on_image_delta` there. No kazoo here: the store's writes and lease come
in as callables.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from ..storage.flusher import GroupCommitFlusher
    from ..storage.log_manager import LogManager
    from ..storage.partition import Partition
    from ..storage.partition_log import PartitionLog
    from .metadata_image import ImageDelta, MetadataImage, PartitionState

log = logging.getLogger(__name__)

Key = tuple[str, int]
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


class Role(Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    STOPPED = "stopped"  # assigned here, but neither leading nor following (offline partition, or no state yet)


class Lease(Protocol):
    """The metadata store's session, as far as acknowledging goes."""

    state: str  # "CONNECTED" | "SUSPENDED" | "LOST"

    def lease_valid(self) -> bool: ...


class FollowerFetchers(Protocol):
    """What the replica manager tells the fetcher (cluster/replica_fetcher.py)."""

    def follow(self, key: Key, part: Partition, leader: int, leader_epoch: int) -> None: ...

    def unfollow(self, key: Key) -> None: ...


# (topic, partition, new state, expected version, controller epoch: None for a leader's ISR write) -> new version
WriteState = Callable[[str, int, Any, int, "int | None"], Awaitable[int]]
# (topic, partition, the replica's new role, its leader epoch): told after each role change of a local replica
RoleListener = Callable[[str, int, "Role", int], None]


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower replica."""

    fetch_offset: int = -1  # the follower's log end, durable by construction; -1 until it fetched
    log_start: int = -1  # the follower's persisted log start offset, as its last fetch reported it
    last_caught_up_ms: int = 0
    last_fetch_leader_end: int = -1  # the leader's log end offset at the follower's previous fetch
    last_fetch_ms: int = 0
    # It lacks this leader's producer state (§4.7): it fetched below the log start or asked for the state, and
    # has not fetched since at or past `snapshot_offset` (the offset of the state served to it, -1 until it asks;
    # it fetches again only after installing it). Neither caught up nor added to the ISR meanwhile.
    snapshot_pending: bool = False
    snapshot_offset: int = -1


@dataclass(slots=True, eq=False)
class Replica:
    """This broker's replica of one partition."""

    topic: str
    index: int
    part: Partition
    topic_id: bytes
    role: Role = Role.STOPPED
    leader: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1  # version of the state znode last applied (the CAS token of ISR writes)
    state: Any = None  # the PartitionState last applied
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = ()
    epoch_start_offset: int = 0  # leader: the log end offset when this epoch began
    leader_high_watermark: int = 0  # follower: the leader's high watermark, as its last fetch response said
    followers: dict[int, FollowerState] = field(default_factory=dict)
    acks: list[tuple[int, int, asyncio.Future]] = field(default_factory=list)  # heap of (end offset, seq, future)
    log_start_waits: list[tuple[int, int, asyncio.Future]] = field(default_factory=list)
    commit_waits: list[tuple[int, int, asyncio.Future]] = field(default_factory=list)  # high watermark waits
    isr_write: asyncio.Task | None = None

    @property
    def key(self) -> Key:
        return self.topic, self.index

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"


def _ms() -> int:
    return int(time.time() * 1000)


async def _wait(future: asyncio.Future, timeout_ms: int) -> bool:
    """Wait for a waiter's future (its result or exception) for at most `timeout_ms`; False on timeout, the
    future then cancelled so whoever completes waiters skips it. asyncio.timeout rather than wait_for: on Python
    3.11, wait_for can swallow a cancellation of the caller that races with the future's completion."""
    try:
        async with asyncio.timeout(max(timeout_ms, 0) / 1000):
            await asyncio.shield(future)
        return True
    except TimeoutError:
        if future.done():  # completed in the same instant: its outcome stands
            future.result()
            return True
        future.cancel()
        return False


class ReplicaManager:
    """One per broker in cluster mode. `start()` on the running loop after the image's first full read."""

    def __init__(
        self,
        node_id: int,
        image: MetadataImage,
        logs: LogManager,
        config: BrokerConfig,
        *,
        write_state: WriteState,
        lease: Lease,
        ensure_local: Callable[[str, int], Partition | None] | None = None,
        delete_local: Callable[[str, int | None], None] | None = None,
        on_readable: Callable[[Key], None] = lambda key: None,
        wake_replica: Callable[[int], None] = lambda replica_id: None,
        on_topic_deleted: Callable[[str, bytes], Awaitable[None]] | None = None,
        flusher: GroupCommitFlusher | None = None,
        now_ms: Callable[[], int] = _ms,
    ) -> None:
        self.node_id = node_id
        self.image = image
        self.logs = logs
        self.config = config
        self.fetchers: FollowerFetchers | None = None
        self._write_state = write_state
        self._lease = lease
        # Where local copies come from and go: the log manager's cluster-mode replicas by default.
        self._ensure_local = ensure_local or self._open_replica
        self._delete_local = delete_local or self._delete_replica
        self._on_readable = on_readable
        self._wake_replica = wake_replica
        self._on_topic_deleted = on_topic_deleted
        self._flusher = flusher
        self._now_ms = now_ms
        self._lag_max_ms: int = config["replica.lag.time.max.ms"]
        # How long a producer-state snapshot waits for its offset to be committed: normally one follower round
        # trip; an ISR member that stopped fetching holds it until it is shrunk out. Well inside the follower's
        # request timeout (replica.socket.timeout.ms), so it gets an answer (REQUEST_TIMED_OUT: ask again).
        self.snapshot_wait_ms: int = config["replica.socket.timeout.ms"] // 2
        self.replicas: dict[Key, Replica] = {}
        self._by_log: dict[int, Replica] = {}  # id(PartitionLog) -> replica, for flush callbacks
        self._durable_waits: dict[int, list[tuple[int, int, asyncio.Future]]] = {}
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._ticker: asyncio.Task | None = None
        self._deleting_done: set[tuple[str, bytes]] = set()
        self._role_listeners: list[RoleListener] = []
        self._started = False

    def add_role_listener(self, listener: RoleListener) -> None:
        """Call `listener(topic, partition, role, leader_epoch)` after each role change of a replica here: it became
        leader (again, when at a newer epoch), became a follower, or stopped (no leader, or no longer assigned).
        The group and transaction coordinators load and unload their partitions from it. Listeners run inside
        the change, on the loop, and must not block; register them before `start()` to hear the roles taken
        at start."""
        self._role_listeners.append(listener)

    def _tell_role(self, rep: Replica) -> None:
        for listener in list(self._role_listeners):
            try:
                listener(rep.topic, rep.index, rep.role, rep.leader_epoch)
            except Exception:  # a listener's failure must not stop the role change
                log.exception("%s: role listener failed", rep.name)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self, fetchers: FollowerFetchers) -> None:
        self.fetchers = fetchers
        self._started = True
        self.image.subscribe(self.on_image_delta)
        self.reconcile_all()
        interval = max(self._lag_max_ms // 2, 10) / 1000
        self._ticker = asyncio.get_running_loop().create_task(self._tick_every(interval), name="oncelog-isr-check")

    async def stop(self) -> None:
        self._started = False
        self.image.unsubscribe(self.on_image_delta)
        tasks = [t for t in (self._ticker, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for rep in list(self.replicas.values()):
            self._fail_waiters(rep, ErrorCode.NOT_LEADER_OR_FOLLOWER, "The broker is shutting down")
        for waits in self._durable_waits.values():
            for _, _, fut in waits:
                if not fut.done():
                    fut.cancel()
        self._durable_waits.clear()

    # -- local copies --------------------------------------------------------------------------------------------
    def _open_replica(self, topic: str, index: int) -> Partition | None:
        """The local copy of a partition assigned here, with the topic id, partition count and configs of the
        image; a local topic of the same name with another id is an older, deleted topic: it goes first."""
        info = self.image.topics[topic]
        configs = self.image.topic_configs.get(topic, {})
        internal = topic in INTERNAL_TOPICS
        try:
            return self.logs.open_replica(topic, info.topic_id, index, info.partition_count, configs, internal)
        except KafkaError as exc:
            if exc.code != ErrorCode.INCONSISTENT_TOPIC_ID:
                log.error("%s-%d: cannot open the local replica: %s", topic, index, exc)
                return None
        log.info("%s: the local copy is of an older topic of that name; deleting it", topic)
        self.logs.delete_topic(topic)
        return self.logs.open_replica(topic, info.topic_id, index, info.partition_count, configs, internal)

    def _delete_replica(self, topic: str, index: int | None) -> None:
        if topic not in self.logs.topics:
            return
        try:
            if index is None:
                self.logs.delete_topic(topic)
            else:
                self.logs.delete_replica(topic, index)
        except KafkaError as exc:
            log.error("deleting the local copy of %s%s failed: %s", topic, "" if index is None else f"-{index}", exc)

    # -- applying the image --------------------------------------------------------------------------------------
    def on_image_delta(self, delta: ImageDelta) -> None:
        keys: set[Key] = set(delta.partitions)
        for name in delta.topics_added | delta.topics_removed:
            keys.update(k for k in self.replicas if k[0] == name)
            info = self.image.topics.get(name)
            if info is not None:
                keys.update((name, p) for p in info.assignment)
        if delta.brokers_changed:
            # A follower that died or came back changes what the leaders here may decide.
            keys.update(k for k, r in self.replicas.items() if r.role is Role.LEADER)
        for key in sorted(keys):
            self._reconcile(key)
        for name in delta.configs:
            self._apply_configs(name)
        if delta.deletions or delta.topics_removed:
            self._apply_deletions()

    def _apply_configs(self, name: str) -> None:
        """A topic's config overrides changed in the image: the local copy takes them (they are the full set)."""
        info, meta = self.image.topics.get(name), self.logs.topics.get(name)
        if info is None or meta is None or meta.topic_id != info.topic_id:
            return
        try:
            self.logs.alter_topic_config(name, dict(self.image.topic_configs.get(name, {})))
        except KafkaError as exc:
            log.error("%s: applying the topic configs failed: %s", name, exc)

    def reconcile_all(self) -> None:
        keys = set(self.image.replicas_on(self.node_id)) | set(self.replicas)
        for key in sorted(keys):
            self._reconcile(key)
        self._apply_deletions()

    def _reconcile(self, key: Key) -> None:
        topic, index = key
        assignment = self.image.assignment(topic, index)
        rep = self.replicas.get(key)
        if assignment is None or self.node_id not in assignment.replicas:
            if rep is not None:
                # Moved away by a reassignment: this copy goes. A deleted topic goes in _apply_deletions, which
                # also reports it; a topic that vanished without a deletion record is left on disk.
                self._remove(rep)
                if assignment is not None:
                    self._delete_local(topic, index)
            return
        state = self.image.partition(topic, index)
        info = self.image.topics[topic]
        topic_id = info.topic_id
        meta = self.logs.topics.get(topic)
        if meta is not None and meta.topic_id == topic_id and meta.partitions < info.partition_count:
            self.logs.set_partition_count(topic, info.partition_count)  # CreatePartitions happened
        if rep is not None and rep.topic_id != topic_id:
            # The topic was deleted and created again under the same name: the old copy is not this one.
            self._remove(rep)
            self._delete_local(topic, None)
            rep = None
        if rep is None:
            part = self._ensure_local(topic, index)
            if part is None:
                log.warning("%s-%d: assigned here but no local replica could be opened", topic, index)
                return
            rep = Replica(topic, index, part, topic_id)
            self.replicas[key] = rep
            self._by_log[id(part.log)] = rep
            # The high watermark is the replicas' from now on. Start it at the log start: after a restart this
            # replica cannot tell how much of its log the others have, and learns it from the leader's fetch
            # answers (as follower) or from its followers' fetches (as leader).
            part.log.use_replicated_high_watermark(part.log.log_start_offset)
        rep.replicas = assignment.replicas
        if state is None:
            return
        if rep.state is not None and state.leader_epoch < rep.leader_epoch:
            return  # older than what was applied (the image only goes forward; be safe anyway)
        if state.leader == self.node_id:
            if rep.role is not Role.LEADER or state.leader_epoch > rep.leader_epoch:
                self._become_leader(rep, state)
            else:
                self._update_leader_state(rep, state)
        elif state.leader >= 0:
            if rep.role is not Role.FOLLOWER or state.leader_epoch > rep.leader_epoch or state.leader != rep.leader:
                self._become_follower(rep, state)
            else:
                rep.state, rep.partition_epoch, rep.isr = state, state.version, state.isr
        else:
            self._stop_serving(rep, state)

    def _become_leader(self, rep: Replica, state: PartitionState) -> None:
        part, plog = rep.part, rep.part.log
        now = self._now_ms()
        if self.fetchers is not None:
            self.fetchers.unfollow(rep.key)
        end = plog.log_end_offset
        part.leader_epochs.assign(state.leader_epoch, end)
        part.leader_epoch = state.leader_epoch
        was = rep.role
        rep.role, rep.leader, rep.leader_epoch = Role.LEADER, self.node_id, state.leader_epoch
        rep.state, rep.partition_epoch, rep.isr = state, state.version, state.isr
        rep.epoch_start_offset = end
        # Every ISR member counts as caught up at the election, the others not yet (as Kafka's makeLeader).
        rep.followers = {r: FollowerState(last_caught_up_ms=now if r in state.isr else 0)
                         for r in rep.replicas if r != self.node_id}
        log.info("%s: leader at epoch %d (was %s), ISR %s, log end %d, high watermark %d", rep.name,
                 state.leader_epoch, was.value, list(state.isr), end, plog.high_watermark)
        self._advance_high_watermark(rep)
        self._tell_role(rep)

    def _update_leader_state(self, rep: Replica, state: PartitionState) -> None:
        """The same leadership, a newer state znode (an ISR change written by us or by the controller) or a new
        assignment (a reassignment adds or removes followers)."""
        now = self._now_ms()
        for r in rep.replicas:
            if r != self.node_id and r not in rep.followers:
                rep.followers[r] = FollowerState(last_caught_up_ms=now if r in state.isr else 0)
        for r in [r for r in rep.followers if r not in rep.replicas]:
            del rep.followers[r]
        if state.version > rep.partition_epoch:
            rep.state, rep.partition_epoch, rep.isr = state, state.version, state.isr
        self._advance_high_watermark(rep)

    def _become_follower(self, rep: Replica, state: PartitionState) -> None:
        if rep.role is Role.LEADER:
            self._fail_waiters(rep, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                               f"{rep.name}: leadership moved to broker {state.leader} at epoch {state.leader_epoch}")
        rep.part.leader_epoch = -1
        rep.role, rep.leader, rep.leader_epoch = Role.FOLLOWER, state.leader, state.leader_epoch
        rep.state, rep.partition_epoch, rep.isr = state, state.version, state.isr
        rep.followers = {}
        log.info("%s: follower of broker %d at epoch %d", rep.name, state.leader, state.leader_epoch)
        self._tell_role(rep)  # before the fetcher may truncate what a coordinator here loaded
        if self.fetchers is not None:
            self.fetchers.follow(rep.key, rep.part, state.leader, state.leader_epoch)

    def _stop_serving(self, rep: Replica, state: PartitionState | None) -> None:
        if rep.role is Role.LEADER:
            self._fail_waiters(rep, ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{rep.name} has no leader")
        if rep.role is Role.FOLLOWER and self.fetchers is not None:
            self.fetchers.unfollow(rep.key)
        rep.part.leader_epoch = -1
        was = rep.role
        rep.role, rep.leader, rep.followers = Role.STOPPED, -1, {}
        if state is not None:
            rep.state, rep.partition_epoch, rep.isr = state, state.version, state.isr
            rep.leader_epoch = state.leader_epoch
        if was is not Role.STOPPED:
            self._tell_role(rep)

    def _remove(self, rep: Replica) -> None:
        self._stop_serving(rep, None)
        del self.replicas[rep.key]
        self._by_log.pop(id(rep.part.log), None)
        log.info("%s: no longer a replica here", rep.name)

    def _apply_deletions(self) -> None:
        """Delete local copies of topics being deleted that still name this broker, then report them gone."""
        for name, deletion in list(self.image.deleting.items()):
            for topic_id, pending in deletion.pending.items():
                if self.node_id not in pending or (name, topic_id) in self._deleting_done:
                    continue
                current = self.image.topics.get(name)
                if current is not None and current.topic_id == topic_id:
                    continue  # the topic is still there: the controller removes it first
                for key in [k for k in self.replicas if k[0] == name]:
                    self._remove(self.replicas[key])
                if current is None:
                    self._delete_local(name, None)
                self._deleting_done.add((name, topic_id))
                if self._on_topic_deleted is not None:
                    self._spawn(self._report_deleted(name, topic_id))

    async def _report_deleted(self, name: str, topic_id: bytes) -> None:
        assert self._on_topic_deleted is not None
        try:
            await self._on_topic_deleted(name, topic_id)
        except Exception as exc:  # the controller's retry (or the next start) asks again
            self._deleting_done.discard((name, topic_id))
            log.warning("reporting the deletion of %s failed: %s", name, exc)

    # -- questions the broker asks (the cluster's PartitionAccess delegates here) ------------------------------
    def leader_replica(self, topic: str, index: int, current_leader_epoch: int = -1) -> Replica | ErrorCode:
        rep = self.replicas.get((topic, index))
        if rep is None:
            if self.image.assignment(topic, index) is None:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch != -1 and current_leader_epoch != rep.leader_epoch:
            return (ErrorCode.FENCED_LEADER_EPOCH if current_leader_epoch < rep.leader_epoch
                    else ErrorCode.UNKNOWN_LEADER_EPOCH)
        if rep.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return rep

    def leader_epoch(self, topic: str, index: int) -> int:
        state = self.image.partition(topic, index)
        return -1 if state is None else state.leader_epoch

    def min_insync_replicas(self, rep: Replica) -> int:
        return rep.part.log.config["min.insync.replicas"]

    def check_append(self, rep: Replica, acks: int) -> ErrorCode:
        if self._lease.state == "LOST":
            return ErrorCode.NOT_LEADER_OR_FOLLOWER  # §5.4: the write side of leaderships goes with the session
        if acks == -1 and len(rep.isr) < self.min_insync_replicas(rep):
            return ErrorCode.NOT_ENOUGH_REPLICAS
        return ErrorCode.NONE

    def client_log_start(self, rep: Replica) -> int:
        """§4.7: never a log start offset the ISR has not persisted. ISR members that have not fetched since the
        election were in the ISR when the previous leader answered, so their log start is at least that."""
        start = rep.part.log.log_start_offset
        if rep.role is not Role.LEADER:
            return start
        for r in rep.isr:
            f = rep.followers.get(r)
            if f is not None and 0 <= f.log_start < start:
                start = f.log_start
        return start

    def offsets_available(self, rep: Replica) -> bool:
        """False while a new leader's high watermark is below the start of its epoch: ListOffsets LATEST answers
        OFFSET_NOT_AVAILABLE then, as Kafka does, rather than an offset the previous leader had passed."""
        return rep.part.log.high_watermark >= rep.epoch_start_offset

    async def wait_acks_all(self, rep: Replica, end_offset: int, timeout_ms: int) -> None:
        if rep.role is not Role.LEADER:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{rep.name}: not the leader any more")
        if rep.part.log.high_watermark >= end_offset and self._lease.lease_valid():
            self._check_isr_after_append(rep)
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(rep.acks, (end_offset, next(self._seq), future))
        if not await _wait(future, timeout_ms):
            raise KafkaError(ErrorCode.REQUEST_TIMED_OUT,
                             f"{rep.name}: offset {end_offset - 1} was not replicated to the ISR "
                             f"{list(rep.isr)} within {timeout_ms} ms")

    def _check_isr_after_append(self, rep: Replica) -> None:
        if len(rep.isr) < self.min_insync_replicas(rep):
            raise KafkaError(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                             f"{rep.name}: the ISR {list(rep.isr)} is below min.insync.replicas "
                             f"{self.min_insync_replicas(rep)}")

    def _complete_acks(self, rep: Replica) -> None:
        if not (rep.acks or rep.commit_waits) or not self._lease.lease_valid():
            return
        hw = rep.part.log.high_watermark
        commits = rep.commit_waits
        while commits and commits[0][0] <= hw:
            future = heapq.heappop(commits)[2]
            if not future.done():
                future.set_result(None)
        heap = rep.acks
        if not heap:
            return
        error: KafkaError | None = None
        try:
            self._check_isr_after_append(rep)
        except KafkaError as exc:
            error = exc
        while heap and heap[0][0] <= hw:
            future = heapq.heappop(heap)[2]
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaError(error.code, error.message))

    async def wait_log_start(self, rep: Replica, offset: int, timeout_ms: int) -> int:
        """DeleteRecords completes once the ISR's minimum log start offset reached `offset` (§4.7)."""
        start = self.client_log_start(rep)
        if start >= offset:
            return start
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(rep.log_start_waits, (offset, next(self._seq), future))
        if not await _wait(future, timeout_ms):
            raise KafkaError(ErrorCode.REQUEST_TIMED_OUT,
                             f"{rep.name}: the replicas did not delete records before {offset} within "
                             f"{timeout_ms} ms")
        return future.result()

    def _complete_log_start_waits(self, rep: Replica) -> None:
        heap = rep.log_start_waits
        if not heap:
            return
        start = self.client_log_start(rep)
        while heap and heap[0][0] <= start:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(start)

    async def producer_snapshot(self, rep: Replica, replica_id: int) -> tuple[bytes, int, int]:
        """FetchSnapshot from the follower `replica_id` (§4.7): (this leader's producer state in the snapshot
        format, the log end offset L it describes, the leader epoch it was taken at).

        Taken at once, answered once L is committed (high watermark >= L under a valid lease, as acks=all): a
        state that counted batches a later leader could cut would make the follower answer retries of lost
        batches as duplicates. From now on the follower joins the ISR only once its fetch offset passed L
        (it installs the state when its log reaches L, before fetching further). KafkaError:
        NOT_LEADER_OR_FOLLOWER (not leading, not a replica, or the leadership moved meanwhile),
        REQUEST_TIMED_OUT (L not committed within `snapshot_wait_ms`: the follower asks again)."""
        if rep.role is not Role.LEADER:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{rep.name}: not the leader")
        f = rep.followers.get(replica_id)
        if f is None:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{rep.name}: broker {replica_id} is not a replica")
        epoch = rep.leader_epoch
        data, offset = rep.part.export_producer_state()
        f.snapshot_pending, f.snapshot_offset = True, offset
        if replica_id in rep.isr:
            # It says it lacks producer state (restarted from a log that started over, faster than the
            # controller took it out): not in sync, and the commit below must not wait for its fetches.
            self._maybe_shrink_isr(rep, self._now_ms())
        await self.wait_committed(rep, offset, self.snapshot_wait_ms)
        if rep.role is not Role.LEADER or rep.leader_epoch != epoch:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{rep.name}: the leadership moved")
        log.info("%s: producer state of %d producers at offset %d served to broker %d", rep.name,
                 len(rep.part.producers.entries), offset, replica_id)
        return data, offset, epoch

    async def wait_committed(self, rep: Replica, offset: int, timeout_ms: int) -> None:
        """Return once the high watermark reached `offset` while the lease was valid; KafkaError
        REQUEST_TIMED_OUT after `timeout_ms`, NOT_LEADER_OR_FOLLOWER if the leadership goes meanwhile."""
        if rep.role is not Role.LEADER:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{rep.name}: not the leader any more")
        if rep.part.log.high_watermark >= offset and self._lease.lease_valid():
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(rep.commit_waits, (offset, next(self._seq), future))
        if not await _wait(future, timeout_ms):
            raise KafkaError(ErrorCode.REQUEST_TIMED_OUT,
                             f"{rep.name}: offset {offset} was not committed within {timeout_ms} ms")

    def _fail_waiters(self, rep: Replica, code: ErrorCode, message: str) -> None:
        for heap in (rep.acks, rep.log_start_waits, rep.commit_waits):
            while heap:
                future = heapq.heappop(heap)[2]
                if not future.done():
                    future.set_exception(KafkaError(code, message))

    # -- the leader's follower tracking ----------------------------------------------------------------------
    def follower_fetch(self, rep: Replica, replica_id: int, fetch_offset: int, log_start: int,
                       broker_epoch: int = -1) -> ErrorCode:
        """A follower's fetch reached the leader: record where it is (its durable end) and decide what follows
        (high watermark, ISR expansion, waiting acknowledgements). Kafka's updateFollowerFetchState.

        A fetch naming a broker epoch older than the follower's registration, or from a broker with no live
        registration, comes from a stale incarnation (a paused process whose session expired, replaced by a
        restarted one): STALE_BROKER_EPOCH, and its position counts for nothing (§3). A fetch naming no epoch
        is not checked."""
        if rep.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        f = rep.followers.get(replica_id)
        if f is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER  # not an assigned replica of this partition
        if broker_epoch >= 0:
            registered = self.image.broker_epoch(replica_id)
            if registered is None or broker_epoch < registered:
                return ErrorCode.STALE_BROKER_EPOCH
        plog = rep.part.log
        leo = plog.log_end_offset
        if fetch_offset > leo:
            return ErrorCode.NONE  # the read answers OFFSET_OUT_OF_RANGE; nothing to learn from it
        now = self._now_ms()
        if fetch_offset < plog.log_start_offset:
            # The read answers OFFSET_OUT_OF_RANGE and the follower starts over at the log start: the producers
            # whose batches were deleted will be missing there until it installs this leader's snapshot
            # (§4.7). An ISR member asking this has lost what it had (a wiped disk): it leaves the ISR now.
            f.snapshot_pending = True
            if f.snapshot_offset < plog.log_start_offset:
                # A state served at or above the log start stays the one it installs: the follower keeps it
                # across this start-over (it drops only one below where it starts, and then asks again), so it
                # will not ask again, and forgetting its offset here would keep it out of the ISR for good (a
                # DeleteRecords between the answer and its next fetch: faults cluster seed 21, idem-2).
                f.snapshot_offset = -1
            f.fetch_offset, f.last_caught_up_ms = fetch_offset, 0
            f.last_fetch_leader_end, f.last_fetch_ms = leo, now
            if replica_id in rep.isr:
                self._maybe_shrink_isr(rep, now)
            return ErrorCode.NONE
        if fetch_offset >= leo:
            f.last_caught_up_ms = max(f.last_caught_up_ms, now)
        elif fetch_offset >= f.last_fetch_leader_end:
            f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
        f.last_fetch_leader_end, f.last_fetch_ms = leo, now
        f.fetch_offset = fetch_offset
        if f.snapshot_pending and 0 <= f.snapshot_offset <= fetch_offset:
            f.snapshot_pending = False  # a fetch at or past the state's offset comes after its install
        if log_start >= 0:
            f.log_start = log_start
        if replica_id not in rep.isr:
            self._maybe_expand_isr(rep, replica_id, f)
        self._advance_high_watermark(rep)
        self._complete_log_start_waits(rep)
        return ErrorCode.NONE

    def _advance_high_watermark(self, rep: Replica) -> None:
        plog = rep.part.log
        new = plog.durable_end
        for r in rep.isr:
            if r == self.node_id:
                continue
            f = rep.followers.get(r)
            if f is None or f.fetch_offset < 0:
                return  # an ISR member not heard from since the election: the high watermark waits for it
            new = min(new, f.fetch_offset)
        if plog.set_high_watermark(new):
            self._on_readable(rep.key)
            if self._flusher is not None:
                self._flusher.high_watermark_moved(plog)  # in-process writers waiting on the flusher (coordinators)
        self._complete_acks(rep)

    def _caught_up(self, rep: Replica, replica_id: int, now: int) -> bool:
        f = rep.followers.get(replica_id)
        if f is None or f.snapshot_pending:
            return False  # not a replica, or it lacks the producer state (§4.7)
        return f.fetch_offset >= rep.part.log.log_end_offset or now - f.last_caught_up_ms <= self._lag_max_ms

    def _maybe_expand_isr(self, rep: Replica, replica_id: int, f: FollowerState) -> None:
        if rep.isr_write is not None or replica_id not in rep.replicas or not self.image.is_live(replica_id):
            return
        plog = rep.part.log
        if f.fetch_offset < plog.high_watermark or f.fetch_offset < rep.epoch_start_offset:
            return
        if f.snapshot_pending:
            return  # it has not installed the producer state it lacks (§4.7)
        if not self._lease.lease_valid():
            return
        self._write_isr(rep, (*rep.isr, replica_id), f"broker {replica_id} caught up at {f.fetch_offset}")

    def _maybe_shrink_isr(self, rep: Replica, now: int) -> None:
        if rep.isr_write is not None:
            return
        lagging = [r for r in rep.isr if r != self.node_id and not self._caught_up(rep, r, now)]
        if not lagging or not self._lease.lease_valid():
            return
        self._write_isr(rep, tuple(r for r in rep.isr if r not in lagging),
                        f"{lagging} not caught up for {self._lag_max_ms} ms")

    def _write_isr(self, rep: Replica, isr: tuple[int, ...], why: str) -> None:
        state = rep.state
        new = dataclasses.replace(state, isr=isr, log_start_floor=max(state.log_start_floor,
                                                                      self.client_log_start(rep)))
        expected, epoch = rep.partition_epoch, rep.leader_epoch

        async def write() -> None:
            try:
                version = await self._write_state(rep.topic, rep.index, new, expected, None)
            except Exception as exc:  # StaleVersion: someone else wrote; the watch brings it and we decide again
                log.info("%s: ISR change to %s not written (%s): %s", rep.name, list(isr), type(exc).__name__, exc)
                return
            finally:
                rep.isr_write = None
            if rep.role is Role.LEADER and rep.leader_epoch == epoch and rep.partition_epoch <= expected:
                rep.state = dataclasses.replace(new, version=version)
                rep.partition_epoch, rep.isr = version, isr
            log.info("%s: ISR %s -> %s (%s)", rep.name, list(state.isr), list(isr), why)
            self._advance_high_watermark(rep)

        rep.isr_write = self._spawn(write())

    async def _tick_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.tick()
            except Exception:
                log.exception("ISR check failed")

    def tick(self) -> None:
        """Periodic duties: shrink ISRs of lagging followers, acknowledge what waited for the lease."""
        now = self._now_ms()
        for rep in list(self.replicas.values()):
            if rep.role is Role.LEADER:
                self._maybe_shrink_isr(rep, now)
                self._complete_acks(rep)

    def lease_restored(self) -> None:
        """The store confirmed its session again: acknowledge what the lease held back."""
        for rep in list(self.replicas.values()):
            if rep.role is Role.LEADER:
                self._complete_acks(rep)

    # -- durability and the follower side ----------------------------------------------------------------------
    def on_flushed(self, plog: PartitionLog) -> None:
        """The flusher finished a round that covered `plog` (the broker's on_high_watermark hook)."""
        rep = self._by_log.get(id(plog))
        if rep is not None:
            if rep.role is Role.LEADER:
                self._advance_high_watermark(rep)
            elif rep.role is Role.FOLLOWER and plog.set_high_watermark(rep.leader_high_watermark) and \
                    self._flusher is not None:
                self._flusher.high_watermark_moved(plog)
        waits = self._durable_waits.get(id(plog))
        if waits:
            durable = plog.durable_end
            while waits and waits[0][0] <= durable:
                future = heapq.heappop(waits)[2]
                if not future.done():
                    future.set_result(None)
            if not waits:
                del self._durable_waits[id(plog)]

    async def wait_durable(self, plog: PartitionLog, offset: int) -> None:
        """Return once `plog`'s durable end reached `offset`: a follower's next fetch waits for this (§4.3)."""
        if plog.durable_end >= offset:
            return
        if plog.offline_reason is not None:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Log {plog.name} is offline: {plog.offline_reason}")
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._durable_waits.setdefault(id(plog), []), (offset, next(self._seq), future))
        await future

    def follower_progress(self, key: Key, leader_high_watermark: int) -> None:
        """A fetch response from the leader: follow its high watermark, up to what is durable here."""
        rep = self.replicas.get(key)
        if rep is None or rep.role is not Role.FOLLOWER:
            return
        rep.leader_high_watermark = max(rep.leader_high_watermark, leader_high_watermark)
        if rep.part.log.set_high_watermark(rep.leader_high_watermark) and self._flusher is not None:
            self._flusher.high_watermark_moved(rep.part.log)

    def appended(self, part: Partition) -> None:
        """A produce appended to a partition led here: followers parked in a fetch read it now, before the
        leader's own flush (their fsync and the leader's then run at the same time).

        A follower not heard from on this partition since this broker leads it (a new partition, an election)
        may be parked in a fetch of its other partitions from here: that fetch answers now, so its next one asks
        for this partition too, instead of after replica.fetch.wait.max.ms."""
        key = (part.topic, part.index)
        self._on_readable(key)
        rep = self.replicas.get(key)
        if rep is not None and rep.role is Role.LEADER:
            for r in rep.isr:
                f = rep.followers.get(r)
                if r != self.node_id and f is not None and f.fetch_offset < 0:
                    self._wake_replica(r)

    def is_following(self, key: Key, leader: int, leader_epoch: int) -> bool:
        rep = self.replicas.get(key)
        return rep is not None and rep.role is Role.FOLLOWER and rep.leader == leader and \
            rep.leader_epoch == leader_epoch

    def expire_producers(self, expiration_ms: int, forget_ms: int | None = None) -> int:
        """Producer expiry on every partition led or followed here, by the same rule (§4.7): a follower's idle
        clock starts when it replicates a batch, after the leader's, so it forgets a producer no earlier than
        its leader does, and DescribeProducers answers alike on every replica once both have decided."""
        now = self._now_ms()
        count = 0
        for rep in list(self.replicas.values()):
            if rep.role in (Role.LEADER, Role.FOLLOWER):
                gone = rep.part.expire_producers(now, expiration_ms, forget_ms)
                if gone:
                    log.info("%s: expired producer state of %s", rep.name, gone)
                    count += len(gone)
        return count

    # -- internals ---------------------------------------------------------------------------------------------
    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
