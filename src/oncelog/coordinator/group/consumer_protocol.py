"""What the coordinator needs to know of the consumer protocol: the topics a member subscribes to.

The coordinator never interprets assignments, but OffsetDelete (GROUP_SUBSCRIBED_TO_TOPIC) and
offset expiry of Stable groups need the subscribed topics. Every version of
ConsumerProtocolSubscription starts with the v0 fields (int16 version, then an array of
topic names), so that prefix is all that is parsed, as Kafka does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

CONSUMER_PROTOCOL_TYPE = "consumer"

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def subscribed_topics(metadata: bytes) -> set[str] | None:
    """Topics of one member's subscription; None when the bytes do not follow the schema."""
    try:
        (version,) = _I16.unpack_from(metadata, 0)
        if version < 0:
            return None
        (count,) = _I32.unpack_from(metadata, 2)
        if count < 0 or count > len(metadata):
            return None
        pos = 6
        topics = set()
        for _ in range(count):
            (length,) = _I16.unpack_from(metadata, pos)
            pos += 2
            if length < 0 or pos + length > len(metadata):
                return None
            topics.add(bytes(metadata[pos : pos + length]).decode("utf-8"))
            pos += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def group_subscriptions(protocol_type: str | None, metadatas: Iterable[bytes]) -> set[str] | None:
    """The union of the members' topics for a consumer group; None when it cannot be known."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE:
        return None
    topics: set[str] = set()
    for metadata in metadatas:
        member_topics = subscribed_topics(metadata)
        if member_topics is None:
            return None
        topics |= member_topics
    return topics
