"""Small pieces shared by handlers."""

from __future__ import annotations

import time
import uuid
from typing import Any

UNKNOWN_AUTHORIZED_OPERATIONS = None  # encodes as -2^31: "not requested"


def now_ms() -> int:
    return int(time.time() * 1000)


def topic_uuid(topic_id: bytes | None) -> uuid.UUID:
    return uuid.UUID(bytes=topic_id) if topic_id else uuid.UUID(int=0)


def find_topic_by_id(broker: Any, topic_id: uuid.UUID | None) -> str | None:
    if topic_id is None or topic_id.int == 0:
        return None
    for name, meta in broker.logs.topics.items():
        if meta.topic_id == topic_id.bytes:
            return name
    return None
