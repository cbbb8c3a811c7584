"""The group coordinator of one broker: every classic group and its committed offsets.

It owns the group table and wires the pieces: `Membership` (the join/sync/heartbeat
protocol), `OffsetManager` (commits, fetches, transactional offsets, expiry) and an
`OffsetsLog` (`__consumer_offsets`). On start it replays that topic; afterwards every
change is appended there before anyone is told about it.

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
from .api import FetchedOffset, JoinRequest, JoinResult, LeavingMember, OffsetCommitItem, SyncResult
from .group import STATE_BY_LOWER_NAME, Group, GroupState
from .loader import load_partition
from .membership import Membership
from .metrics import GroupMetrics
from .offset_manager import OffsetManager
from .offsets import TopicPartition
from .records import encode_group_key, encode_offset_key
from .settings import GroupSettings
from .store import OffsetsLog, OffsetsTopic, Written

if TYPE_CHECKING:
    from ..host import GroupHost

log = logging.getLogger("oncelog.groups")

TxnOffset = tuple[str, int, int, str | None, int]  # topic, partition, offset, metadata, leader epoch


def _now_ms() -> int:
    return int(time.time() * 1000)


class GroupCoordinator:
    def __init__(self, settings: GroupSettings, offsets_log: OffsetsLog, *,
                 partition_exists: Callable[[str, int], bool] | None = None,
                 metrics: GroupMetrics | None = None, clock: Callable[[], int] = _now_ms) -> None:
        self.settings = settings
        self.log = offsets_log
        self.clock = clock
        self.metrics = metrics if metrics is not None else GroupMetrics()
        self.groups: dict[str, Group] = {}
        self.membership = Membership(self.groups, settings, offsets_log, self.metrics, clock)
        self.offsets = OffsetManager(self.groups, settings, offsets_log, self.metrics, clock,
                                     partition_exists or (lambda topic, partition: True),
                                     self.membership.touch, self._forget_group)
        self.metrics.watch(lambda: self.groups.values())
        self._expiry: asyncio.Task | None = None

    @classmethod
    def for_broker(cls, broker: GroupHost) -> GroupCoordinator:
        def transactional_id_of(producer_id: int) -> str | None:
            txn = getattr(broker, "txn_coordinator", None)
            return None if txn is None else txn.by_producer.get(producer_id)

        settings = GroupSettings.from_config(broker.config)
        topic = OffsetsTopic(broker.logs, broker.flusher, settings.offsets_partitions, transactional_id_of)
        return cls(settings, topic, partition_exists=lambda t, p: broker.logs.get_partition(t, p) is not None,
                   metrics=GroupMetrics(broker.metrics.registry))

    # -- lifecycle ------------------------------------------------------------------------------------------
    def startup(self) -> None:
        """Create `__consumer_offsets` if needed and load every group and offset from it."""
        ensure = getattr(self.log, "ensure", None)
        if ensure is not None:
            ensure()
        started = time.monotonic()
        records = 0
        for partition in range(self.log.partitions):
            loaded = load_partition(self.log.replay(partition), f"__consumer_offsets-{partition}")
            records += loaded.records
            self.groups.update(loaded.groups)
            for producer_id, group_ids in loaded.producer_groups.items():
                self.offsets.producer_groups.setdefault(producer_id, set()).update(group_ids)
        log.info("group coordinator loaded %d groups (%d pending transactional producers) from %d records "
                 "in %.0f ms", len(self.groups), len(self.offsets.producer_groups), records,
                 (time.monotonic() - started) * 1000)

    def start(self) -> None:
        """Start member session timers and offset expiry (inside the running loop)."""
        self.membership.start()
        self._expiry = asyncio.get_running_loop().create_task(self._expire_periodically())

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
            self._expiry = None
        self.membership.stop()

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
        return await self.membership.join(request)

    async def sync_group(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                         protocol_type: str | None, protocol_name: str | None,
                         assignments: dict[str, bytes]) -> SyncResult:
        return await self.membership.sync(group_id, generation, member_id, instance_id, protocol_type,
                                          protocol_name, assignments)

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> ErrorCode:
        return self.membership.heartbeat(group_id, generation, member_id, instance_id)

    def leave_group(self, group_id: str, members: list[LeavingMember]) -> tuple[ErrorCode, list[ErrorCode]]:
        return self.membership.leave(group_id, members)

    # -- offsets -------------------------------------------------------------------------------------------------
    async def commit_offsets(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                             items: list[OffsetCommitItem], retention_ms: int = -1) -> list[ErrorCode]:
        return await self.offsets.commit(group_id, generation, member_id, instance_id, items, retention_ms)

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None,
                      require_stable: bool = False) -> tuple[ErrorCode, list[FetchedOffset]]:
        return self.offsets.fetch(group_id, partitions, require_stable)

    async def delete_offsets(self, group_id: str,
                             partitions: list[TopicPartition]) -> tuple[ErrorCode, list[ErrorCode]]:
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
        return await self.offsets.txn_commit(group_id, producer_id, producer_epoch, items, generation_id,
                                             member_id or "", group_instance_id, transactional_id)

    async def stage_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                                offsets: Iterable[TxnOffset], *, generation_id: int = -1, member_id: str = "",
                                group_instance_id: str | None = None,
                                transactional_id: str | None = None) -> ErrorCode:
        """TxnOffsetCommit with one error for the whole request: nothing is staged unless all of it can be."""
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
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return {"group_id": group_id, "group_state": GroupState.DEAD.value, "protocol_type": "",
                    "protocol_data": "", "members": []}
        return group.describe()

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        results: dict[str, ErrorCode] = {}
        writes: list[tuple[str, Written]] = []
        for group_id in group_ids:
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
                writes.append((group_id, self.log.append(self.partition_for(group_id), records, self.clock())))
        for group_id, written in writes:
            error = await self.log.durable(written)
            if error:
                log.error("group %s: deletion is not durable: %s", group_id, error.name)
        return results
