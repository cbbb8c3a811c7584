"""The broker settings the group coordinator reads, resolved once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Kafka's defaults for settings oncelog's config does not define (yet).
OFFSET_METADATA_MAX_BYTES = 4096
OFFSETS_RETENTION_CHECK_INTERVAL_MS = 600_000
GROUP_MAX_SIZE = 2**31 - 1
# A new member's JoinGroup may wait this long for its first rebalance before the member is dropped
# (Kafka's GroupCoordinator.NewMemberJoinTimeoutMs).
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000
# How long a commit (and any group write) waits for the in-sync replicas of its __consumer_offsets partition.
OFFSET_COMMIT_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class GroupSettings:
    offsets_partitions: int = 50
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS
    offset_metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES
    group_max_size: int = GROUP_MAX_SIZE
    # Largest protocol metadata one member may send in JoinGroup: it is stored in a
    # group-metadata record, so it must fit the record size the offsets topic accepts.
    max_member_metadata_bytes: int = 1048588
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS
    offset_commit_timeout_ms: int = OFFSET_COMMIT_TIMEOUT_MS

    @classmethod
    def from_config(cls, config: Any) -> GroupSettings:
        values: Mapping[str, Any] = getattr(config, "values", config)

        def get(key: str, default: Any) -> Any:
            value = values.get(key)
            return default if value is None else value

        return cls(
            offsets_partitions=get("offsets.topic.num.partitions", 50),
            min_session_timeout_ms=get("group.min.session.timeout.ms", 6000),
            max_session_timeout_ms=get("group.max.session.timeout.ms", 1_800_000),
            initial_rebalance_delay_ms=get("group.initial.rebalance.delay.ms", 3000),
            offsets_retention_ms=get("offsets.retention.minutes", 10080) * 60_000,
            retention_check_interval_ms=get("offsets.retention.check.interval.ms",
                                            OFFSETS_RETENTION_CHECK_INTERVAL_MS),
            offset_metadata_max_bytes=get("offset.metadata.max.bytes", OFFSET_METADATA_MAX_BYTES),
            group_max_size=get("group.max.size", GROUP_MAX_SIZE),
            max_member_metadata_bytes=get("message.max.bytes", 1048588),
            offset_commit_timeout_ms=get("offsets.commit.timeout.ms", OFFSET_COMMIT_TIMEOUT_MS),
        )
