"""Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete, TxnOffsetCommit's storage, expiry.

A commit is answered only once its records are durable in `__consumer_offsets`; only then
does it become visible to OffsetFetch. Transactional commits are appended as transactional
batches of the committing producer and stay pending until the transaction coordinator
reports the producer's marker (`complete_txn`); meanwhile OffsetFetch with
`require_stable` answers UNSTABLE_OFFSET_COMMIT for those partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import ErrorCode
from .api import FetchedOffset, OffsetCommitItem
from .consumer_protocol import CONSUMER_PROTOCOL_TYPE
from .group import Group, GroupState
from .offsets import CommittedOffset, TopicPartition
from .records import OffsetValue, encode_group_key, encode_offset_key, encode_offset_value
from .store import TxnProducer, Written

if TYPE_CHECKING:
    from .metrics import GroupMetrics
    from .settings import GroupSettings
    from .store import OffsetsLog

log = logging.getLogger("oncelog.groups")

EMPTY = GroupState.EMPTY
DEAD = GroupState.DEAD


def offset_write_error(error: ErrorCode) -> ErrorCode:
    """What a failed offset write tells the committer (Kafka's maybeConvertOffsetCommitError)."""
    if error in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                 ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return error


class OffsetManager:
    def __init__(self, groups: dict[str, Group], settings: GroupSettings, log_: OffsetsLog, metrics: GroupMetrics,
                 clock: Callable[[], int], partition_exists: Callable[[str, int], bool],
                 touch: Callable[[Group, str], None], forget_group: Callable[[Group], None]) -> None:
        self.groups = groups
        self.settings = settings
        self.log = log_
        self.metrics = metrics
        self.clock = clock
        self.partition_exists = partition_exists
        self._touch = touch
        self._forget_group = forget_group
        # Producers with staged transactional offsets -> their groups, to find them when the marker comes.
        self.producer_groups: dict[int, set[str]] = {}

    # -- OffsetCommit -----------------------------------------------------------------------------------------
    @staticmethod
    def _validate(group: Group, generation: int, member_id: str, instance_id: str | None,
                  transactional: bool) -> ErrorCode | None:
        """Kafka's validateOffsetCommit: who may commit for this group, and at which generation."""
        if group.is_(DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation < 0 and group.is_(EMPTY):
            return None  # a consumer that does not use group management, or the admin client
        if generation >= 0 or member_id or instance_id is not None:
            error = group.validate_member(member_id, instance_id)
            if error is not None:
                return error
            return ErrorCode.ILLEGAL_GENERATION if generation != group.generation else None
        if not transactional and not group.is_(EMPTY):
            return ErrorCode.UNKNOWN_MEMBER_ID  # only members commit for an active group
        return None

    async def commit(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                     items: list[OffsetCommitItem], retention_ms: int = -1) -> list[ErrorCode]:
        group = self.groups.get(group_id)
        if group is None:
            if generation >= 0:
                return [ErrorCode.ILLEGAL_GENERATION] * len(items)
            group = self.groups[group_id] = Group(group_id)  # a "simple" group that only stores offsets
        error = self._validate(group, generation, member_id, instance_id, transactional=False)
        if error is None and group.is_(GroupState.COMPLETING_REBALANCE):
            # The member has its new generation but not its assignment yet: it must not commit now.
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if error is not None:
            return [error] * len(items)
        if group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            self._touch(group, member_id)
        return await self._store(group, items, retention_ms, None)

    async def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int, items: list[OffsetCommitItem],
                         generation: int = -1, member_id: str = "", instance_id: str | None = None,
                         transactional_id: str | None = None) -> list[ErrorCode]:
        if not group_id:
            return [ErrorCode.INVALID_GROUP_ID] * len(items)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        error = self._validate(group, generation, member_id, instance_id, transactional=True)
        if error is not None:
            return [error] * len(items)
        return await self._store(group, items, -1, TxnProducer(producer_id, producer_epoch, transactional_id))

    async def _store(self, group: Group, items: list[OffsetCommitItem], retention_ms: int,
                     producer: TxnProducer | None) -> list[ErrorCode]:
        now = self.clock()
        errors = [ErrorCode.NONE] * len(items)
        expire = now + retention_ms if retention_ms != -1 else -1
        values: dict[TopicPartition, CommittedOffset] = {}
        accepted = []
        for i, item in enumerate(items):
            if not self.partition_exists(item.topic, item.partition):
                errors[i] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif item.metadata is not None and len(item.metadata) > self.settings.offset_metadata_max_bytes:
                errors[i] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                accepted.append(i)
                values[(item.topic, item.partition)] = CommittedOffset(
                    item.offset, item.leader_epoch, item.metadata or "", now, expire)
        if not values:
            return errors
        records = [
            (encode_offset_key(group.group_id, topic, partition),
             encode_offset_value(OffsetValue(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp,
                                             v.expire_timestamp)))
            for (topic, partition), v in values.items()
        ]
        offsets = group.offsets
        if producer is None:
            offsets.begin_commit(values)
        else:
            self.producer_groups.setdefault(producer.producer_id, set()).add(group.group_id)
            for tp, value in values.items():
                offsets.stage(producer.producer_id, tp, value)
        written = self.log.append(self.log.partition_for(group.group_id), records, now, producer)
        for value in values.values():
            value.log_offset = written.base_offset
        error = written.error or await self.log.durable(written)
        if producer is None:
            offsets.end_commit(values)
            if not error and not group.is_(DEAD):
                for tp, value in values.items():
                    offsets.put(tp, value)
        elif error:
            offsets.unstage(producer.producer_id, values)
            self._forget_producer_group(producer.producer_id, group)
        if error:
            log.warning("group %s: offset commit failed: %s %s", group.group_id, error.name, written.message or "")
            mapped = offset_write_error(error)
            for i in accepted:
                errors[i] = mapped
        else:
            self.metrics.offset_commits.labels("consumer" if producer is None else "transactional").inc(len(values))
        return errors

    # -- transactions -----------------------------------------------------------------------------------------
    def complete_txn(self, producer_id: int, commit: bool, partition: int | None = None) -> int:
        """The producer's COMMIT/ABORT marker is (being) written to `__consumer_offsets` `partition`
        (None: every partition): make its staged offsets visible, or drop them. Returns offsets applied."""
        group_ids = self.producer_groups.get(producer_id)
        if not group_ids:
            return 0
        applied = 0
        for group_id in list(group_ids):
            if partition is not None and self.log.partition_for(group_id) != partition:
                continue
            group_ids.discard(group_id)
            group = self.groups.get(group_id)
            if group is not None and not group.is_(DEAD):
                applied += group.offsets.complete(producer_id, commit)
        if not group_ids:
            del self.producer_groups[producer_id]
        return applied

    def forget_group_producers(self, group_id: str) -> None:
        """The group is gone: no marker needs to find it any more."""
        self.forget_groups_producers({group_id})

    def forget_groups_producers(self, group_ids: set[str]) -> None:
        """The groups are gone (deleted, or their partition unloaded)."""
        if not group_ids:
            return
        for producer_id in list(self.producer_groups):
            remaining = self.producer_groups[producer_id]
            remaining -= group_ids
            if not remaining:
                del self.producer_groups[producer_id]

    def _forget_producer_group(self, producer_id: int, group: Group) -> None:
        if group.offsets.has_pending_from(producer_id) or self.groups.get(group.group_id) is not group:
            return  # still pending, or `group` was unloaded meanwhile (a reload's mapping is not ours to drop)
        group_ids = self.producer_groups.get(producer_id)
        if group_ids is not None:
            group_ids.discard(group.group_id)
            if not group_ids:
                del self.producer_groups[producer_id]

    # -- OffsetFetch ------------------------------------------------------------------------------------------
    def fetch(self, group_id: str, partitions: list[TopicPartition] | None,
              require_stable: bool) -> tuple[ErrorCode, list[FetchedOffset]]:
        group = self.groups.get(group_id)
        if group is None or group.is_(DEAD):
            return ErrorCode.NONE, [FetchedOffset(t, p) for t, p in partitions or []]
        offsets = group.offsets
        wanted = partitions if partitions is not None else sorted(offsets.committed)
        out = []
        for topic, partition in wanted:
            tp = (topic, partition)
            if require_stable and offsets.is_unstable(tp):
                out.append(FetchedOffset(topic, partition, error=ErrorCode.UNSTABLE_OFFSET_COMMIT))
                continue
            value = offsets.committed.get(tp)
            if value is None:
                out.append(FetchedOffset(topic, partition))
            else:
                out.append(FetchedOffset(topic, partition, value.offset, value.leader_epoch, value.metadata))
        return ErrorCode.NONE, out

    # -- OffsetDelete, DeleteGroups, expiry ----------------------------------------------------------------------
    async def delete(self, group_id: str, partitions: list[TopicPartition]) -> tuple[ErrorCode, list[ErrorCode]]:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, []
        group = self.groups.get(group_id)
        if group is None or group.is_(DEAD):
            return ErrorCode.GROUP_ID_NOT_FOUND, []
        if not group.is_(EMPTY) and group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return ErrorCode.NON_EMPTY_GROUP, []
        errors = []
        eligible = []
        for topic, partition in partitions:
            if not self.partition_exists(topic, partition):
                errors.append(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            elif not group.is_(EMPTY) and group.is_subscribed_to(topic):
                errors.append(ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)
            else:
                errors.append(ErrorCode.NONE)
                eligible.append((topic, partition))
        removed = group.offsets.remove(eligible)
        written = self.cleanup(group, removed)
        if written is not None:
            await self.log.durable(written)
        if removed:
            log.info("group %s: deleted offsets of %s", group_id, removed)
        return ErrorCode.NONE, errors

    def cleanup(self, group: Group, removed: list[TopicPartition]) -> Written | None:
        """Write tombstones for `removed`; an Empty group left without offsets dies (tombstoned if it ever
        had a generation; a group that only stored offsets has no metadata record to remove)."""
        records: list[tuple[bytes, bytes | None]] = [
            (encode_offset_key(group.group_id, topic, partition), None) for topic, partition in removed
        ]
        if (group.state in (EMPTY, DEAD) and not group.offsets.has_offsets and not group.pending_members
                and not group.members):
            if not group.is_(DEAD):
                group.transition(DEAD, self.clock())
            self._forget_group(group)
            if group.generation > 0:
                records.append((encode_group_key(group.group_id), None))
            log.info("group %s is gone (generation %d)", group.group_id, group.generation)
        if removed:
            self.metrics.offsets_expired.inc(len(removed))
        if not records:
            return None
        written = self.log.append(self.log.partition_for(group.group_id), records, self.clock())
        if written.error:
            log.warning("group %s: tombstones not written: %s %s", group.group_id, written.error.name,
                        written.message or "")
        return written

    @staticmethod
    def _expiry_rule(group: Group) -> tuple[Callable[[CommittedOffset], int], frozenset[str]] | None:
        """From when an offset's retention counts, and which topics never expire; None: nothing expires."""
        def committed_at(v: CommittedOffset) -> int:
            return v.commit_timestamp

        if group.protocol_type is None:  # offsets-only group: each offset from its own commit
            return committed_at, frozenset()
        if group.is_(EMPTY):  # everyone left: retention counts from then
            since = group.state_timestamp
            return (lambda v: since if since is not None else v.commit_timestamp), frozenset()
        if (group.is_(GroupState.STABLE) and group.protocol_type == CONSUMER_PROTOCOL_TYPE
                and group.subscribed_topics is not None):  # topics nobody subscribes to any more
            return committed_at, frozenset(group.subscribed_topics)
        return None

    def expire(self, now_ms: int | None = None) -> int:
        """Remove offsets past `offsets.retention.minutes` (Kafka's rules) and groups left with nothing."""
        now = self.clock() if now_ms is None else now_ms
        total = 0
        for group in list(self.groups.values()):
            rule = None if group.is_(DEAD) else self._expiry_rule(group)
            if rule is None:
                continue
            base, keep = rule
            expired = group.offsets.drop_committed(
                group.offsets.expired(now, self.settings.offsets_retention_ms, base, keep))
            if expired or (group.is_(EMPTY) and not group.offsets.has_offsets):
                self.cleanup(group, expired)
                total += len(expired)
        if total:
            log.info("expired %d offsets", total)
        return total
