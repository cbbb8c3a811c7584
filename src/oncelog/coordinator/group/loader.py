"""Rebuild groups and offsets from one partition of `__consumer_offsets`, as Kafka loads it.

The log is replayed in order: the last value of a key wins, a tombstone removes it.
Offsets in transactional batches are kept per producer until that producer's marker:
COMMIT applies them (where they are newer in the log than the current value), ABORT drops
them, and no marker yet leaves them pending, so `require_stable` still sees them and the
transaction coordinator can complete them after the restart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from .group import Group
from .offsets import CommittedOffset
from .records import (
    GroupKey,
    OffsetKey,
    RecordFormatError,
    decode_group_value,
    decode_key,
    decode_offset_value,
)
from .store import StoredMarker, StoredRecord

log = logging.getLogger(__name__)

GroupTopicPartition = tuple[str, str, int]


@dataclass
class Loaded:
    groups: dict[str, Group] = field(default_factory=dict)
    producer_groups: dict[int, set[str]] = field(default_factory=dict)  # producers with staged offsets
    records: int = 0
    skipped: int = 0


def _offset(value: bytes, batch_offset: int) -> CommittedOffset:
    v = decode_offset_value(value)
    return CommittedOffset(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp, batch_offset)


class PartitionLoader:
    """The replay of one partition, fed in steps (a load on a running broker gives the loop back between
    steps), then `result()` once the log end is reached."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._offsets: dict[GroupTopicPartition, CommittedOffset] = {}
        self._pending: dict[int, dict[GroupTopicPartition, CommittedOffset]] = {}
        self._values: dict[str, bytes] = {}
        self._out = Loaded()

    def feed(self, entry: StoredRecord | StoredMarker) -> None:
        offsets, pending, values, out = self._offsets, self._pending, self._values, self._out
        if isinstance(entry, StoredMarker):
            staged = pending.pop(entry.producer_id, None)
            if entry.commit and staged:
                for key, value in staged.items():
                    current = offsets.get(key)
                    if current is None or current.older_than(value):
                        offsets[key] = value
            return
        out.records += 1
        try:
            key = decode_key(entry.key)
            if isinstance(key, OffsetKey):
                gtp = (key.group, key.topic, key.partition)
                target = offsets if entry.producer_id < 0 else pending.setdefault(entry.producer_id, {})
                if entry.value is None:
                    target.pop(gtp, None)
                else:
                    target[gtp] = _offset(entry.value, entry.batch_offset)
            elif isinstance(key, GroupKey):
                if entry.value is None:
                    values.pop(key.group, None)
                else:
                    decode_group_value(entry.value)  # refuse a damaged record now, not at the end
                    values[key.group] = entry.value
            else:
                out.skipped += 1  # a record type that is not ours (KIP-848, share groups)
        except RecordFormatError as exc:
            out.skipped += 1
            log.error("%s: unreadable record at batch %d skipped: %s", self.name, entry.batch_offset, exc)

    def result(self) -> Loaded:
        out = self._out
        groups = out.groups
        for group_id, raw in self._values.items():
            groups[group_id] = Group.from_value(group_id, decode_group_value(raw))
        for (group_id, topic, partition), value in self._offsets.items():
            group = groups.get(group_id)
            if group is None:
                group = groups[group_id] = Group(group_id)  # a group that only stores offsets
            group.offsets.committed[(topic, partition)] = value
        for producer_id, staged in self._pending.items():
            for (group_id, topic, partition), value in staged.items():
                group = groups.get(group_id)
                if group is None:
                    group = groups[group_id] = Group(group_id)
                group.offsets.stage(producer_id, (topic, partition), value)
                out.producer_groups.setdefault(producer_id, set()).add(group_id)
        return out


def load_partition(entries: Iterable[StoredRecord | StoredMarker], name: str = "") -> Loaded:
    loader = PartitionLoader(name)
    for entry in entries:
        loader.feed(entry)
    return loader.result()
