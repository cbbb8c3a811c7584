"""The group coordinator of one broker: the classic groups of the `__consumer_offsets` partitions it leads.

It owns the group table and wires the pieces: `Membership` (the join/sync/heartbeat
protocol), `OffsetManager` (commits, fetches, transactional offsets, expiry) and an
`OffsetsLog` (`__consumer_offsets`). Every change is appended there before anyone is told
about it, with acks=all, so the log is the groups' state and survives its broker.

Ownership is per partition (`..ownership`): the broker calls `on_leadership(topic, partition,
leader_epoch)` when it becomes the leader of a `__consumer_offsets` partition, and the
coordinator replays that partition in the background (its groups answer
COORDINATOR_LOAD_IN_PROGRESS meanwhile); `on_resignation(topic, partition)` drops the
partition's groups, answering their waiting JoinGroup/SyncGroup with NOT_COORDINATOR so
the members look the coordinator up again. Groups of partitions not loaded here answer
NOT_COORDINATOR. Writes name the leader epoch of their load, so a coordinator whose
partition moved cannot append to it. The single node calls `startup()` instead, which
owns every partition at epoch 0 and loads them all before the broker listens.

For the transaction coordinator:
- `stage_txn_offsets(group_id, producer_id, producer_epoch, offsets, ...)` writes a
  TxnOffsetCommit as a transactional batch of that producer and keeps it pending;
- `complete_txn(producer_id, commit, partition)` applies or drops a producer's pending
  offsets when its COMMIT/ABORT marker goes to that `__consumer_offsets` partition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode
from ..ownership import SINGLE_NODE_EPOCH, Ownership, PartitionLoad
from .api import FetchedOffset, JoinRequest, JoinResult, LeavingMember, OffsetCommitItem, SyncResult
from .group import STATE_BY_LOWER_NAME, Group, GroupState
from .loader import Loaded, PartitionLoader, load_partition
from .membership import Membership
from .metrics import GroupMetrics
from .offset_manager import OffsetManager
from .offsets import TopicPartition
from .records import encode_group_key, encode_offset_key
from .settings import GroupSettings
from .store import OFFSETS_TOPIC, OffsetsLog, OffsetsTopic, StoredMarker, StoredRecord, TxnProducer, Written

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from ..host import GroupHost

log = logging.getLogger("oncelog.groups")

TxnOffset = tuple[str, int, int, str | None, int]  # topic, partition, offset, metadata, leader epoch
# Records replayed between two turns of the event loop while a partition loads on a running broker.
LOAD_STEP = 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


class _OwnedLog:
    """The offsets log as the coordinator's parts write it: appends go through only for partitions whose load is
    complete here, stamped with that load's leader epoch (the partition access refuses the write once another
    broker leads the partition at a newer epoch)."""

    def __init__(self, inner: OffsetsLog, owned: Ownership) -> None:
        self._inner = inner
        self._owned = owned

    @property
    def partitions(self) -> int:
        return self._inner.partitions

    def partition_for(self, group_id: str) -> int:
        return self._inner.partition_for(group_id)

    def append(self, partition: int, records: Sequence[tuple[bytes, bytes | None]], now_ms: int,
               producer: TxnProducer | None = None, leader_epoch: int = -1) -> Written:
        load = self._owned.loaded(partition)
        if load is None:
            return Written(ErrorCode.NOT_COORDINATOR, f"{OFFSETS_TOPIC}-{partition} is not loaded on this broker")
        return self._inner.append(partition, records, now_ms, producer, load.leader_epoch)

    async def durable(self, written: Written) -> ErrorCode:
        return await self._inner.durable(written)

    def end_offset(self, partition: int) -> int:
        return self._inner.end_offset(partition)

    def replay(self, partition: int, start: int | None = None) -> Iterator[StoredRecord | StoredMarker]:
        return self._inner.replay(partition, start)


class GroupCoordinator:
    def __init__(self, settings: GroupSettings, offsets_log: OffsetsLog, *,
                 partition_exists: Callable[[str, int], bool] | None = None,
                 metrics: GroupMetrics | None = None, clock: Callable[[], int] = _now_ms) -> None:
        self.settings = settings
        self.log = offsets_log
        self.clock = clock
        self.metrics = metrics if metrics is not None else GroupMetrics()
        self.groups: dict[str, Group] = {}
        self.owned = Ownership(OFFSETS_TOPIC)
        writes = _OwnedLog(offsets_log, self.owned)
        self._writes = writes
        self.membership = Membership(self.groups, settings, writes, self.metrics, clock)
        self.offsets = OffsetManager(self.groups, settings, writes, self.metrics, clock,
                                     partition_exists or (lambda topic, partition: True),
                                     self.membership.touch, self._forget_group)
        self.metrics.watch(lambda: self.groups.values())
        self._expiry: asyncio.Task | None = None
        self._started = False

    @classmethod
    def for_broker(cls, broker: GroupHost) -> GroupCoordinator:
        def transactional_id_of(producer_id: int) -> str | None:
            txn = getattr(broker, "txn_coordinator", None)
            return None if txn is None else txn.by_producer.get(producer_id)

        settings = GroupSettings.from_config(broker.config)
        topic = OffsetsTopic(broker.logs, broker.flusher, settings.offsets_partitions, transactional_id_of,
                             access=lambda: broker.partitions, commit_timeout_ms=settings.offset_commit_timeout_ms)
        # A partition "exists" when the broker knows a leader epoch for it: a local one on the single node, one in
        # the metadata image in a cluster (whether or not this broker holds a replica of it).
        return cls(settings, topic, partition_exists=lambda t, p: broker.partitions.leader_epoch(t, p) >= 0,
                   metrics=GroupMetrics(broker.metrics.registry))

    # -- lifecycle ------------------------------------------------------------------------------------------
    def startup(self) -> None:
        """The single node: create `__consumer_offsets` if needed and own every partition of it at epoch 0,
        loaded now (before the broker listens)."""
        ensure = getattr(self.log, "ensure", None)
        if ensure is not None:
            ensure()
        started = time.monotonic()
        records = 0
        for partition in range(self.log.partitions):
            if self.owned.get(partition) is not None:
                continue
            load = self.owned.begin(partition, SINGLE_NODE_EPOCH)
            loaded = load_partition(self.log.replay(partition), f"{OFFSETS_TOPIC}-{partition}")
            records += loaded.records
            self._install(load, loaded)
        log.info("group coordinator loaded %d groups (%d pending transactional producers) from %d records "
                 "in %.0f ms", len(self.groups), len(self.offsets.producer_groups), records,
                 (time.monotonic() - started) * 1000)

    def start(self) -> None:
        """Start member session timers and offset expiry (inside the running loop)."""
        self._started = True
        self.membership.start()
        self._expiry = asyncio.get_running_loop().create_task(self._expire_periodically())

    async def stop(self) -> None:
        self._started = False
        tasks = self.owned.tasks()
        if self._expiry is not None:
            tasks.append(self._expiry)
            self._expiry = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.membership.stop()

    # -- partition ownership (the broker's leadership of __consumer_offsets partitions) --------------------------
    def on_leadership(self, topic: str, partition: int, leader_epoch: int) -> None:
        """This broker became the leader of `topic`-`partition` at `leader_epoch` (any topic may be named; only
        `__consumer_offsets` concerns this coordinator): load its groups."""
        if topic == OFFSETS_TOPIC:
            self.load_partition(partition, leader_epoch)

    def on_resignation(self, topic: str, partition: int) -> None:
        """This broker no longer leads `topic`-`partition` (follower, offline or removed): drop its groups."""
        if topic == OFFSETS_TOPIC:
            self.unload_partition(partition)

    def load_partition(self, partition: int, leader_epoch: int) -> asyncio.Task | None:
        """Start loading `partition` in the background (requests for its groups get COORDINATOR_LOAD_IN_PROGRESS
        until it is done); returns the loading task. Nothing happens if it is loaded or loading at this epoch
        or a newer one. A newer epoch than the one loaded means the leadership moved away and came back (the
        image may skip the steps between), so the partition is unloaded and loaded again from its log."""
        current = self.owned.get(partition)
        if current is not None:
            if leader_epoch <= current.leader_epoch:
                return current.task
            self.unload_partition(partition)
        if self.owned.empty:
            adopt = getattr(self.log, "adopt_partition_count", None)
            if adopt is not None:
                adopt()  # only while nothing is owned: the count decides which partition a group lives in
        load = self.owned.begin(partition, leader_epoch)
        load.task = asyncio.get_running_loop().create_task(self._load(load),
                                                           name=f"oncelog-load-{OFFSETS_TOPIC}-{partition}")
        return load.task

    def unload_partition(self, partition: int) -> None:
        """Drop the groups of `partition` (Kafka's onGroupUnloaded): each becomes Dead, its timers stop, and its
        members' waiting JoinGroup/SyncGroup are answered NOT_COORDINATOR; a load in progress is cancelled."""
        load = self.owned.drop(partition)
        if load is None:
            return
        gone = [g for g in self.groups.values() if self.partition_for(g.group_id) == partition]
        for group in gone:
            del self.groups[group.group_id]
            self.membership.unload(group)
        self.offsets.forget_groups_producers({g.group_id for g in gone})
        log.info("%s-%d unloaded (leader epoch %d): %d groups are coordinated elsewhere now", OFFSETS_TOPIC,
                 partition, load.leader_epoch, len(gone))

    @property
    def loading(self) -> bool:
        """Whether some partition is still loading (ListGroups answers COORDINATOR_LOAD_IN_PROGRESS then)."""
        return self.owned.loading

    def owner_error(self, group_id: str) -> ErrorCode:
        """NONE when this coordinator serves `group_id`, else NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS.
        An empty group id is let through: the request's own validation answers INVALID_GROUP_ID first."""
        if not group_id:
            return ErrorCode.NONE
        return self.owned.error(self.partition_for(group_id))

    async def _load_pause(self) -> None:
        """Give the event loop a turn during a load (tests replace it to hold a load open)."""
        await asyncio.sleep(0)

    async def _load(self, load: PartitionLoad) -> None:
        partition = load.partition
        name = f"{OFFSETS_TOPIC}-{partition}"
        started = time.monotonic()
        loader = PartitionLoader(name)
        try:
            await self._load_pause()
            start: int | None = None
            while True:
                # Replay to the log end, then again from there if anything was appended meanwhile (transaction
                # markers); the last pass ends without giving the loop a turn, so nothing is missed.
                end = self.log.end_offset(partition)
                for count, entry in enumerate(self.log.replay(partition, start), 1):
                    loader.feed(entry)
                    if count % LOAD_STEP == 0:
                        await self._load_pause()
                if self.log.end_offset(partition) == end:
                    break
                start = end
            loaded = loader.result()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: loading groups failed; the partition is not coordinated here", name)
            if self.owned.is_current(load):
                self.owned.drop(partition)
            return
        if self._install(load, loaded):
            log.info("%s loaded at leader epoch %d: %d groups from %d records in %.0f ms", name, load.leader_epoch,
                     len(loaded.groups), loaded.records, (time.monotonic() - started) * 1000)

    def _install(self, load: PartitionLoad, loaded: Loaded) -> bool:
        """Make a finished load visible at once: its groups, their pending transactional offsets, and (on a
        running coordinator) a full session for every loaded member to come back."""
        if not self.owned.finish(load):
            return False
        self.groups.update(loaded.groups)
        for producer_id, group_ids in loaded.producer_groups.items():
            self.offsets.producer_groups.setdefault(producer_id, set()).update(group_ids)
        if self._started:
            self.membership.resume(loaded.groups.values())
        return True

    async def _expire_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.retention_check_interval_ms / 1000)
            try:
                self.expire_offsets()
            except Exception:
                log.exception("offset expiry failed")

    def _forget_group(self, group: Group) -> None:
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        self.membership.cancel_group_timers(group)
        self.offsets.forget_group_producers(group.group_id)

    def partition_for(self, group_id: str) -> int:
        return self.log.partition_for(group_id)

    # -- the group protocol ----------------------------------------------------------------------------------
    async def join_group(self, request: JoinRequest) -> JoinResult:
        error = self.owner_error(request.group_id)
        if error:
            return JoinResult(error, request.member_id)
        return await self.membership.join(request)

    async def sync_group(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                         protocol_type: str | None, protocol_name: str | None,
                         assignments: dict[str, bytes]) -> SyncResult:
        error = self.owner_error(group_id)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            # The rebalance in progress was lost with the previous coordinator: start over at JoinGroup, without
            # rediscovering the coordinator (older clients do not know COORDINATOR_LOAD_IN_PROGRESS here; Kafka's
            # answer).
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if error:
            return SyncResult(error)
        return await self.membership.sync(group_id, generation, member_id, instance_id, protocol_type,
                                          protocol_name, assignments)

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> ErrorCode:
        error = self.owner_error(group_id)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return ErrorCode.NONE  # Kafka answers blindly while loading; the member's session starts at the load
        if error:
            return error
        return self.membership.heartbeat(group_id, generation, member_id, instance_id)

    def leave_group(self, group_id: str, members: list[LeavingMember]) -> tuple[ErrorCode, list[ErrorCode]]:
        error = self.owner_error(group_id)
        if error:
            return error, []
        return self.membership.leave(group_id, members)

    # -- offsets -------------------------------------------------------------------------------------------------
    async def commit_offsets(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                             items: list[OffsetCommitItem], retention_ms: int = -1) -> list[ErrorCode]:
        error = self.owner_error(group_id)
        if error:
            return [error] * len(items)
        return await self.offsets.commit(group_id, generation, member_id, instance_id, items, retention_ms)

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None,
                      require_stable: bool = False) -> tuple[ErrorCode, list[FetchedOffset]]:
        error = self.owner_error(group_id)
        if error:
            return error, [FetchedOffset(t, p, error=error) for t, p in partitions or []]
        return self.offsets.fetch(group_id, partitions, require_stable)

    async def delete_offsets(self, group_id: str,
                             partitions: list[TopicPartition]) -> tuple[ErrorCode, list[ErrorCode]]:
        error = self.owner_error(group_id)
        if error:
            return error, []
        return await self.offsets.delete(group_id, partitions)

    def expire_offsets(self, now_ms: int | None = None) -> int:
        return self.offsets.expire(now_ms)

    # -- transactional offsets (the transaction coordinator's side) -------------------------------------------
    async def txn_offset_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                                offsets: Iterable[TxnOffset], *, generation_id: int = -1, member_id: str = "",
                                group_instance_id: str | None = None,
                                transactional_id: str | None = None) -> list[ErrorCode]:
        """TxnOffsetCommit with one error per partition, in the order given (Kafka's answer)."""
        items = [OffsetCommitItem(topic, partition, offset, leader_epoch, metadata)
                 for topic, partition, offset, metadata, leader_epoch in offsets]
        error = self.owner_error(group_id)
        if error:
            return [error] * len(items)
        return await self.offsets.txn_commit(group_id, producer_id, producer_epoch, items, generation_id,
                                             member_id or "", group_instance_id, transactional_id)

    async def stage_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                                offsets: Iterable[TxnOffset], *, generation_id: int = -1, member_id: str = "",
                                group_instance_id: str | None = None,
                                transactional_id: str | None = None) -> ErrorCode:
        """TxnOffsetCommit with one error for the whole request: nothing is staged unless all of it can be."""
        error = self.owner_error(group_id)
        if error:
            return error
        items = list(offsets)
        for topic, partition, _offset, metadata, _epoch in items:
            if not self.offsets.partition_exists(topic, partition):
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if metadata is not None and len(metadata) > self.settings.offset_metadata_max_bytes:
                return ErrorCode.OFFSET_METADATA_TOO_LARGE
        errors = await self.txn_offset_commit(group_id, producer_id, producer_epoch, items,
                                              generation_id=generation_id, member_id=member_id,
                                              group_instance_id=group_instance_id, transactional_id=transactional_id)
        return next((e for e in errors if e), ErrorCode.NONE)

    def complete_txn(self, producer_id: int, commit: bool, partition: int | None = None) -> int:
        """Only groups loaded here are completed: a partition that is loading replays the marker itself."""
        return self.offsets.complete_txn(producer_id, commit, partition)

    def has_pending_txn_offsets(self, group_id: str, topic: str, partition: int) -> bool:
        group = self.groups.get(group_id)
        return group is not None and any((topic, partition) in staged
                                         for staged in group.offsets.pending_txn.values())

    # -- administration -----------------------------------------------------------------------------------------
    def list_groups(self, states: Iterable[str] = ()) -> list[dict[str, Any]]:
        wanted = {STATE_BY_LOWER_NAME.get(s.lower()) for s in states}
        out = []
        for group in list(self.groups.values()):
            if group.is_(GroupState.DEAD) or (wanted and group.state not in wanted):
                continue
            out.append({"group_id": group.group_id, "protocol_type": group.protocol_type or "",
                        "group_state": group.state.value})
        return out

    def describe_group(self, group_id: str) -> dict[str, Any]:
        """The group as DescribeGroups shows it; with an `error_code` when it is not coordinated here."""
        error = self.owner_error(group_id)
        if error:
            return {"group_id": group_id, "error_code": error, "group_state": "", "protocol_type": "",
                    "protocol_data": "", "members": []}
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return {"group_id": group_id, "group_state": GroupState.DEAD.value, "protocol_type": "",
                    "protocol_data": "", "members": []}
        return group.describe()

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        results: dict[str, ErrorCode] = {}
        writes: list[tuple[str, Written]] = []
        for group_id in group_ids:
            error = self.owner_error(group_id)
            if error:
                results[group_id] = error
                continue
            group = self.groups.get(group_id)
            if group is None or group.is_(GroupState.DEAD):
                results[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
                continue
            if not group.is_(GroupState.EMPTY):
                results[group_id] = ErrorCode.NON_EMPTY_GROUP
                continue
            group.transition(GroupState.DEAD, self.clock())
            removed = group.offsets.remove_all()
            group.offsets.pending_txn.clear()
            self._forget_group(group)
            records: list[tuple[bytes, bytes | None]] = [
                (encode_offset_key(group_id, topic, partition), None) for topic, partition in removed]
            if group.generation > 0:
                records.append((encode_group_key(group_id), None))
            results[group_id] = ErrorCode.NONE
            log.info("group %s deleted with %d offsets", group_id, len(removed))
            if records:
                writes.append((group_id, self._writes.append(self.partition_for(group_id), records, self.clock())))
        for group_id, written in writes:
            error = await self._writes.durable(written)
            if error:
                log.error("group %s: deletion is not durable: %s", group_id, error.name)
        return results
