"""The names the exactly-once sink owns in the broker: one transactional id, and one marker group, per
(sink id, Spark partition id).

Why per Spark partition and not per batch or per attempt (research/spark.md §7): a replay of batch N, a task
retry and a zombie attempt of partition p all use the same transactional id, so `InitProducerId` of the newest
one fences the others and aborts whatever they left open; and the number of ids, hence of transaction
coordinator state, is bounded by the write parallelism instead of growing with every batch.

The sink id is the user's `sink.id` option, or else the streaming query's id, which Spark keeps in the
checkpoint's metadata file and hands to every task as the `sql.streaming.queryId` local property: stable for
as long as the checkpoint lives, new for a new checkpoint.
"""

from __future__ import annotations

import json
import os
from urllib.parse import urlparse

PREFIX = "oncelog-sink"


def transactional_id(sink_id: str, partition: int) -> str:
    return f"{PREFIX}.{sink_id}.p{partition}"


def marker_group(sink_id: str, partition: int) -> str:
    """The consumer group whose committed offset is the partition's batch marker.

    One group per transactional id: only that id ever commits to it, so an open transaction of another
    partition can never make its OffsetFetch(require_stable) wait.
    """
    return transactional_id(sink_id, partition)


def query_id_from_checkpoint(checkpoint_location: str | None) -> str | None:
    """The query id in `<checkpoint>/metadata` (a local or file: checkpoint), for the driver side of the sink.

    The driver's `commit`/`abort` run outside any task, so TaskContext cannot tell them the query id; the
    checkpoint can. None when the checkpoint is not on a local file system or has no metadata yet.
    """
    if not checkpoint_location:
        return None
    parsed = urlparse(checkpoint_location)
    if parsed.scheme not in ("", "file"):
        return None
    path = os.path.join(parsed.path if parsed.scheme else checkpoint_location, "metadata")
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline()
        value = json.loads(first).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
