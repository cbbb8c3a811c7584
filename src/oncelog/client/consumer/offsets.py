"""Offsets the consumer asks for or stores: ListOffsets (resets, watermarks, times), OffsetFetch, OffsetCommit.

Every call retries what Kafka calls retriable (leader moved, coordinator moving or loading,
connection lost) until its deadline, refreshing metadata or rediscovering the coordinator
in between; anything else is raised as the typed client error. A commit refused because the
group moved on (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID) is not retried:
the offsets belong to a generation that no longer exists, and the caller must rejoin.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, NamedTuple

from oncelog.client.errors import KafkaError, KafkaTimeoutError, RetriableError, error_for
from oncelog.client.types import ConsumerGroupMetadata
from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey

TP = tuple[str, int]

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

_COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})
_GENERATION_GONE = frozenset({ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION,
                              ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID})
GROUP_COORDINATOR = 0


class CommitFailed(KafkaError):
    """The group rebalanced (or this member was removed) before the commit: the consumer must rejoin."""


class ListedOffset(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int | None


class CommittedOffset(NamedTuple):
    offset: int  # -1: nothing committed
    metadata: str | None
    leader_epoch: int | None


class OffsetClient:
    def __init__(self, cluster: Any, request_timeout: float, retry_backoff: float) -> None:
        self._cluster = cluster
        self._request_timeout = request_timeout
        self._backoff = retry_backoff

    # -- ListOffsets --------------------------------------------------------------------------------

    async def list_offsets(self, timestamps: Mapping[TP, int], *, read_committed: bool,
                           timeout: float) -> dict[TP, ListedOffset]:
        """Offsets for timestamps (-1 latest, -2 earliest, else the first offset at or after the time).

        A time past the last record gives offset -1, as Kafka answers; `latest` under
        read_committed is the last stable offset.
        """
        deadline = time.monotonic() + timeout
        pending = dict(timestamps)
        result: dict[TP, ListedOffset] = {}
        last_error: KafkaError | None = None
        while pending:
            await self._cluster.refresh_metadata({t for t, _ in pending}, force=last_error is not None)
            by_leader: dict[int, dict[TP, int]] = defaultdict(dict)
            for tp, ts in pending.items():
                leader = self._cluster.leader_for(*tp)
                if leader is None:
                    last_error = RetriableError(f"no leader known for {tp[0]}-{tp[1]}",
                                                ErrorCode.LEADER_NOT_AVAILABLE)
                    continue
                by_leader[leader][tp] = ts
            answers = await asyncio.gather(*(self._list_on(node, parts, read_committed)
                                             for node, parts in by_leader.items()), return_exceptions=True)
            for answer in answers:
                if isinstance(answer, RetriableError):
                    last_error = answer
                    continue
                if isinstance(answer, BaseException):
                    raise answer
                for tp, (code, listed) in answer.items():
                    if code == ErrorCode.NONE:
                        result[tp] = listed
                        pending.pop(tp, None)
                        continue
                    err = error_for(code)
                    if err is not None and not err.retriable:
                        raise KafkaError(f"ListOffsets for {tp[0]}-{tp[1]}: {err.message}", code)
                    last_error = err
            if pending:
                await self._pause(deadline, last_error, "ListOffsets")
        return result

    async def _list_on(self, node: int, parts: Mapping[TP, int],
                       read_committed: bool) -> dict[TP, tuple[int, ListedOffset]]:
        conn = await self._cluster.connection(node)
        version = conn.api_version(ApiKey.LIST_OFFSETS, 7, 1)
        topics: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for (topic, partition), ts in parts.items():
            topics[topic].append({"partition_index": partition, "current_leader_epoch": -1, "timestamp": ts})
        resp = await conn.call(ApiKey.LIST_OFFSETS, {
            "replica_id": -1, "isolation_level": 1 if read_committed else 0,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
        }, version=version, timeout=self._request_timeout)
        out: dict[TP, tuple[int, ListedOffset]] = {}
        for t in resp.topics:
            for p in t.partitions:
                epoch = getattr(p, "leader_epoch", -1)
                out[(t.name, p.partition_index)] = (p.error_code, ListedOffset(
                    p.offset, p.timestamp, epoch if epoch is not None and epoch >= 0 else None))
        return out

    # -- committed offsets ---------------------------------------------------------------------------

    async def fetch_committed(self, group_id: str, partitions: list[TP], *, timeout: float,
                              require_stable: bool = True) -> dict[TP, CommittedOffset]:
        """The group's committed offsets; -1 where nothing is committed.

        `require_stable` makes the coordinator answer UNSTABLE_OFFSET_COMMIT (retried here) while a
        transaction that commits offsets for these partitions is open, so a consumer never starts
        from an offset a pending transaction is about to replace (KIP-447).
        """
        deadline = time.monotonic() + timeout
        topics: dict[str, list[int]] = defaultdict(list)
        for topic, partition in partitions:
            topics[topic].append(partition)
        while True:
            try:
                conn = await self._cluster.coordinator(group_id, GROUP_COORDINATOR)
                version = conn.api_version(ApiKey.OFFSET_FETCH, 7, 1)
                resp = await conn.call(ApiKey.OFFSET_FETCH, {
                    "group_id": group_id, "require_stable": require_stable,
                    "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()],
                }, version=version, timeout=self._request_timeout)
                top = getattr(resp, "error_code", 0) or 0
                if top:
                    self._raise_group_error(group_id, top, "OffsetFetch")
                out: dict[TP, CommittedOffset] = {}
                for t in resp.topics:
                    for p in t.partitions:
                        if p.error_code:
                            self._raise_group_error(group_id, p.error_code, "OffsetFetch")
                        epoch = getattr(p, "committed_leader_epoch", -1)
                        out[(t.name, p.partition_index)] = CommittedOffset(
                            p.committed_offset, p.metadata, epoch if epoch is not None and epoch >= 0 else None)
                return out
            except RetriableError as exc:
                await self._pause(deadline, exc, "OffsetFetch")

    async def commit(self, group: ConsumerGroupMetadata, offsets: Mapping[TP, tuple[int, str | None, int | None]], *,
                     timeout: float) -> None:
        """Commit (offset, metadata, leader epoch) per partition for the group's current generation."""
        if not offsets:
            return
        deadline = time.monotonic() + timeout
        topics: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for (topic, partition), (offset, metadata, epoch) in offsets.items():
            topics[topic].append({"partition_index": partition, "committed_offset": offset,
                                  "committed_leader_epoch": -1 if epoch is None else epoch,
                                  "committed_metadata": metadata})
        while True:
            try:
                conn = await self._cluster.coordinator(group.group_id, GROUP_COORDINATOR)
                version = conn.api_version(ApiKey.OFFSET_COMMIT, 9, 2)
                resp = await conn.call(ApiKey.OFFSET_COMMIT, {
                    "group_id": group.group_id, "generation_id_or_member_epoch": group.generation_id,
                    "member_id": group.member_id, "group_instance_id": group.group_instance_id,
                    "retention_time_ms": -1,
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
                }, version=version, timeout=self._request_timeout)
                for t in resp.topics:
                    for p in t.partitions:
                        if p.error_code:
                            self._raise_group_error(group.group_id, p.error_code, "OffsetCommit")
                return
            except RetriableError as exc:
                await self._pause(deadline, exc, "OffsetCommit")

    def _raise_group_error(self, group_id: str, code: int, api: str) -> None:
        if code in _COORDINATOR_MOVED:
            self._cluster.invalidate_coordinator(group_id, GROUP_COORDINATOR)
            raise RetriableError(f"{api}: coordinator of group {group_id!r} moved or is loading", code)
        if code in _GENERATION_GONE:
            err = error_for(code)
            raise CommitFailed(f"{api} for group {group_id!r} refused: {err.message if err else code}; "
                               "the group rebalanced, rejoin before committing", code)
        err = error_for(code)
        if err is None:
            return
        raise err

    async def _pause(self, deadline: float, error: KafkaError | None, api: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise KafkaTimeoutError(f"{api} did not succeed before its deadline; last error: {error}")
        await asyncio.sleep(min(self._backoff, left))
