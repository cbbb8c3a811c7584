"""An in-memory `__consumer_offsets` and shortcuts for driving a GroupCoordinator in unit tests."""

from __future__ import annotations

import asyncio
import struct
from collections import defaultdict
from collections.abc import Iterator, Sequence

from oncelog.coordinator.group import GroupCoordinator, GroupSettings
from oncelog.coordinator.group.api import JoinRequest, JoinResult, OffsetCommitItem
from oncelog.coordinator.group.metrics import GroupMetrics
from oncelog.coordinator.group.store import StoredMarker, StoredRecord, TxnProducer, Written
from oncelog.coordinator.partitioning import partition_for
from oncelog.errors import ErrorCode


class FakeLog:
    """Keeps appended records per partition; durability can be delayed or failed on demand."""

    def __init__(self, partitions: int = 3) -> None:
        self.partitions = partitions
        self.entries: dict[int, list[StoredRecord | StoredMarker]] = defaultdict(list)
        self.next_offset: dict[int, int] = defaultdict(int)
        self.fail_append: ErrorCode | None = None
        self.fail_durable: ErrorCode | None = None
        self.gate: asyncio.Event | None = None
        self.epochs: dict[int, int] = {}  # the leader epoch each partition's last append named

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    def append(self, partition: int, records: Sequence[tuple[bytes, bytes | None]], now_ms: int,
               producer: TxnProducer | None = None, leader_epoch: int = -1) -> Written:
        self.epochs[partition] = leader_epoch
        if self.fail_append is not None:
            return Written(self.fail_append, "injected append failure")
        base = self.next_offset[partition]
        pid = producer.producer_id if producer is not None else -1
        for key, value in records:
            self.entries[partition].append(StoredRecord(key, value, base, pid))
        self.next_offset[partition] = base + len(records)
        return Written(ErrorCode.NONE, None, partition, base, base + len(records) - 1)

    async def durable(self, written: Written) -> ErrorCode:
        if written.error:
            return written.error
        if self.gate is not None:
            await self.gate.wait()
        return self.fail_durable or ErrorCode.NONE

    def end_offset(self, partition: int) -> int:
        return self.next_offset[partition]

    def replay(self, partition: int, start: int | None = None) -> Iterator[StoredRecord | StoredMarker]:
        yield from list(self.entries[partition][start or 0:])  # one entry per offset

    def marker(self, partition: int, producer_id: int, commit: bool) -> None:
        self.entries[partition].append(StoredMarker(producer_id, commit))
        self.next_offset[partition] += 1

    def records(self) -> list[StoredRecord]:
        return [e for p in sorted(self.entries) for e in self.entries[p] if isinstance(e, StoredRecord)]


class Clock:
    def __init__(self, now: int = 1_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def settings(**overrides) -> GroupSettings:
    base = {"offsets_partitions": 3, "min_session_timeout_ms": 10, "max_session_timeout_ms": 60_000,
            "initial_rebalance_delay_ms": 0, "offsets_retention_ms": 60_000}
    base.update(overrides)
    return GroupSettings(**base)


def coordinator(log: FakeLog | None = None, clock: Clock | None = None, **overrides) -> GroupCoordinator:
    return GroupCoordinator(settings(**overrides), log or FakeLog(), metrics=GroupMetrics(),
                            partition_exists=lambda topic, partition: topic != "missing" and 0 <= partition < 8,
                            clock=clock or Clock())


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, topics, null user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


def join_request(group: str, member_id: str = "", *, instance: str | None = None,
                 protocols: list[tuple[str, bytes]] | None = None, session_ms: int = 5000,
                 rebalance_ms: int = 5000, protocol_type: str = "consumer", v4: bool = True,
                 client_id: str = "client") -> JoinRequest:
    return JoinRequest(group, member_id, instance, client_id, "/127.0.0.1", session_ms, rebalance_ms, protocol_type,
                       protocols if protocols is not None else [("range", subscription("t"))],
                       require_known_member_id=v4)


async def join_new(c: GroupCoordinator, group: str, **kwargs) -> JoinResult:
    """A dynamic member's two-step first join (MEMBER_ID_REQUIRED, then the join with its id)."""
    first = await c.join_group(join_request(group, **kwargs))
    if first.error != ErrorCode.MEMBER_ID_REQUIRED:
        return first
    return await c.join_group(join_request(group, first.member_id, **kwargs))


def commit_items(*entries: tuple[str, int, int]) -> list[OffsetCommitItem]:
    return [OffsetCommitItem(t, p, o) for t, p, o in entries]


def run(coro_fn):
    """Run an async test body with a started coordinator loop; the body starts/stops what it makes."""
    return asyncio.run(asyncio.wait_for(coro_fn(), 30))
