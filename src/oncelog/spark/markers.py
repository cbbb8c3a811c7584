"""Batch markers: how a task learns that its (sink, partition, batch) was already committed.

Choice (research/spark.md §7 leaves two): the marker is a **committed consumer-group offset**, written with
`send_offsets_to_transaction` (AddOffsetsToTxn + TxnOffsetCommit) inside the very transaction that writes the
rows, so rows and marker become visible together or not at all. The alternative, a record in a compacted
marker topic, would need a reader to find the newest record of one key: a scan of the topic (compaction is
lazy and optional) instead of one OffsetFetch. The group offset is one key lookup, and OffsetFetch with
`require_stable` refuses to answer (UNSTABLE_OFFSET_COMMIT, retried) while a transaction that commits it is
still open, so a reader never decides on a marker that is about to change.

Layout: group `oncelog-sink.<sink id>.p<partition>` (one per transactional id), topic-partition
`(<sink.markerTopic>, 0)`, committed offset = the batch id, metadata = JSON `{"query": ..., "rows": ...}`.
Kafka (and oncelog) refuse offset commits for partitions that do not exist, hence the marker topic: one
partition, never written to, created on first use. The query id in the metadata guards a reused `sink.id`:
a marker left by another query (an earlier checkpoint) says nothing about this query's batch ids.

Markers are group offsets, so they are subject to `offsets.retention.minutes` (Kafka: 7 days) once no batch
refreshes them: a query stopped for longer than that and restarted from a checkpoint whose last batch was
written but not recorded would write that batch again. Restart within the retention, or raise it.
"""

from __future__ import annotations

import json
import logging
from typing import NamedTuple

from oncelog.client.admin import Admin
from oncelog.client.cluster import Cluster
from oncelog.client.config import ClientConfig
from oncelog.client.consumer.offsets import OffsetClient
from oncelog.client.errors import KafkaError
from oncelog.client.runtime import cached, get_runtime
from oncelog.client.types import TopicPartition
from oncelog.errors import ErrorCode
from oncelog.spark.write_options import WriteOptions

log = logging.getLogger("oncelog.spark.sink")

MARKER_PARTITION = 0
NO_MARKER = -1


class Marker(NamedTuple):
    batch_id: int  # -1: nothing committed yet
    query_id: str | None
    rows: int


def _admin(options: WriteOptions) -> Admin:
    conf = options.admin_config()
    return cached(("oncelog.spark.sink-admin", tuple(sorted(conf.items()))),
                  lambda: Admin(ClientConfig(conf, "admin")))


def sink_cluster(options: WriteOptions) -> tuple[Cluster, ClientConfig]:
    """The process's cluster view for marker reads and the driver's EndTxn requests (kept across tasks)."""
    conf = options.admin_config()

    def make() -> tuple[Cluster, ClientConfig]:
        config = ClientConfig(conf, "admin")
        cluster = Cluster(config)
        get_runtime().run(cluster.bootstrap())
        return cluster, config

    return cached(("oncelog.spark.sink-cluster", tuple(sorted(conf.items()))), make)


def ensure_marker_topic(options: WriteOptions) -> None:
    """Create the marker topic (one partition, compacted) unless it exists; once per process and topic.

    It is looked up first and created only when missing: on a cluster with ACLs, Kafka answers CreateTopics
    for an existing topic with TOPIC_AUTHORIZATION_FAILED unless the principal may create topics, and a sink
    whose operator created the topic beforehand must not need that right.
    """
    topic = options.marker_topic

    def make() -> bool:
        admin = _admin(options)
        try:
            admin.describe_topic(topic)
            return True
        except KafkaError as exc:
            if exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise
        try:
            admin.create_topic(topic, 1, -1, {"cleanup.policy": "compact"})
        except KafkaError as exc:
            if exc.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                raise KafkaError(
                    f"the sink's marker topic {topic!r} does not exist and this principal may not create it: "
                    "create it (1 partition, cleanup.policy=compact) or grant CREATE on it", exc.code) from None
            if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
        return True

    cached(("oncelog.spark.sink-marker-topic", options.bootstrap_servers, options.marker_topic), make)


def marker_position(options: WriteOptions, batch_id: int, query_id: str, rows: int) -> TopicPartition:
    """The offset commit that records `batch_id` as written (for send_offsets_to_transaction)."""
    metadata = json.dumps({"query": query_id, "rows": rows}, separators=(",", ":"))
    return TopicPartition(options.marker_topic, MARKER_PARTITION, batch_id, metadata)


def read_marker(options: WriteOptions, group: str) -> Marker:
    """The newest committed marker of `group`; waits while a transaction that commits it is open."""
    cluster, config = sink_cluster(options)
    client = OffsetClient(cluster, config["request.timeout.ms"] / 1000, config["retry.backoff.ms"] / 1000)
    tp = (options.marker_topic, MARKER_PARTITION)
    timeout = max(60.0, 2 * config["request.timeout.ms"] / 1000)
    committed = get_runtime().run(client.fetch_committed(group, [tp], timeout=timeout, require_stable=True),
                                  timeout=timeout + 5)
    answer = committed.get(tp)
    if answer is None or answer.offset < 0:
        return Marker(NO_MARKER, None, 0)
    query, rows = None, 0
    try:
        meta = json.loads(answer.metadata or "{}")
        query, rows = meta.get("query"), int(meta.get("rows", 0))
    except (ValueError, AttributeError, TypeError):
        log.warning("batch marker of %s has unreadable metadata %r", group, answer.metadata)
    return Marker(answer.offset, query, rows)
