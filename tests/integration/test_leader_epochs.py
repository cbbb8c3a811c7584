"""Leader epochs on the single node (KIP-320): the broker leads every partition at epoch 0.

Fetch (v9+), ListOffsets (v4+) and OffsetsForLeaderEpoch carry the leader epoch a client believes in; a newer one
than the broker's is UNKNOWN_LEADER_EPOCH (the broker has not learned of an election yet), an older one
FENCED_LEADER_EPOCH. OffsetsForLeaderEpoch answers where an epoch ends; clients use it to validate a position
that carries an epoch, and librdkafka and the Java consumer do exactly that after a seek with an epoch.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from tests.integration.helpers import Out, ck_produce, create_topic, metric, scrape
from tests.support.wire import Wire

NONE, UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 0, 3, 74, 75
RECORDS = 10


@pytest.fixture
def filled(module_broker, topic_name):
    """A one-partition topic holding RECORDS records (offsets 0..RECORDS-1)."""
    create_topic(module_broker.bootstrap, topic_name, 1)
    ck_produce(module_broker.bootstrap, topic_name, [Out(0, None, b"v%d" % i) for i in range(RECORDS)])
    return topic_name


def offsets_for_epoch(bootstrap: str, topic: str, leader_epoch: int, current: int = -1, version: int = 4,
                      partition: int = 0) -> tuple[int, int, int]:
    """(error, leader epoch, end offset) of one partition."""
    req = OffsetForLeaderEpochRequest[version]
    t = req.OffsetForLeaderTopic
    p = t.OffsetForLeaderPartition
    kwargs = {"topics": [t(topic=topic, partitions=[
        p(partition=partition, current_leader_epoch=current, leader_epoch=leader_epoch)])]}
    if version >= 3:
        kwargs["replica_id"] = -1
    with Wire(bootstrap) as w:
        resp = w.request(req(**kwargs), version)
    (rt,) = resp.topics
    assert rt.topic == topic
    (rp,) = rt.partitions
    assert rp.partition == partition
    return rp.error_code, rp.leader_epoch, rp.end_offset


def fetch_with_epoch(bootstrap: str, topic: str, epoch: int, version: int) -> tuple[int, int, int]:
    """(error, high watermark, record bytes) of a fetch at offset 0 naming `epoch`."""
    req = FetchRequest[version]
    ft = req.FetchTopic
    fp = ft.FetchPartition
    kwargs = dict(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                  session_id=0, session_epoch=-1, forgotten_topics_data=[],
                  topics=[ft(topic=topic, partitions=[fp(partition=0, fetch_offset=0, log_start_offset=-1,
                                                          partition_max_bytes=1 << 20, current_leader_epoch=epoch,
                                                          last_fetched_epoch=-1)])])
    if version >= 11:
        kwargs["rack_id"] = ""
    with Wire(bootstrap) as w:
        resp = w.request(req(**kwargs), version)
    (p,) = resp.responses[0].partitions
    return p.error_code, p.high_watermark, len(p.records or b"")


def list_latest_with_epoch(bootstrap: str, topic: str, epoch: int, version: int) -> tuple[int, int, int]:
    """(error, offset, leader epoch) of ListOffsets LATEST naming `epoch`."""
    req = ListOffsetsRequest[version]
    lt = req.ListOffsetsTopic
    lp = lt.ListOffsetsPartition
    with Wire(bootstrap) as w:
        resp = w.request(req(replica_id=-1, isolation_level=0, topics=[lt(name=topic, partitions=[
            lp(partition_index=0, timestamp=-1, current_leader_epoch=epoch)])]), version)
    (p,) = resp.topics[0].partitions
    return p.error_code, p.offset, p.leader_epoch


def test_offsets_for_leader_epoch_is_advertised_at_kafka_4_versions(module_broker):
    with Wire(module_broker.bootstrap) as w:
        resp = w.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
    versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert versions[23] == (2, 4)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offsets_for_leader_epoch_answers_from_the_leader_epoch_history(module_broker, filled, version):
    bs = module_broker.bootstrap
    # Epoch 0 is current and began at the log start: it ends at the log end offset.
    assert offsets_for_epoch(bs, filled, 0, version=version) == (NONE, 0, RECORDS)
    assert offsets_for_epoch(bs, filled, 0, current=0, version=version) == (NONE, 0, RECORDS)
    # No epoch after the current one is known: undefined, without an error (as Kafka answers).
    assert offsets_for_epoch(bs, filled, 3, version=version) == (NONE, -1, -1)
    # The request's idea of the current epoch is checked first.
    assert offsets_for_epoch(bs, filled, 0, current=1, version=version)[0] == UNKNOWN_LEADER_EPOCH
    assert offsets_for_epoch(bs, filled, 0, current=-2, version=version)[0] == FENCED_LEADER_EPOCH
    assert offsets_for_epoch(bs, filled, 0, version=version, partition=1)[0] == UNKNOWN_TOPIC_OR_PARTITION
    assert offsets_for_epoch(bs, filled + "-missing", 0, version=version)[0] == UNKNOWN_TOPIC_OR_PARTITION


def test_offsets_for_leader_epoch_follows_the_log_end(module_broker, filled):
    ck_produce(module_broker.bootstrap, filled, [Out(0, None, b"more")])
    assert offsets_for_epoch(module_broker.bootstrap, filled, 0) == (NONE, 0, RECORDS + 1)


@pytest.mark.parametrize("version", [9, 11, 12])
def test_fetch_checks_the_current_leader_epoch(module_broker, filled, version):
    bs = module_broker.bootstrap
    for epoch in (-1, 0):
        error, hwm, size = fetch_with_epoch(bs, filled, epoch, version)
        assert (error, hwm) == (NONE, RECORDS) and size > 0
    error, hwm, size = fetch_with_epoch(bs, filled, 1, version)
    assert (error, hwm, size) == (UNKNOWN_LEADER_EPOCH, -1, 0)
    assert fetch_with_epoch(bs, filled, -2, version)[0] == FENCED_LEADER_EPOCH


@pytest.mark.parametrize("version", [4, 6, 7])
def test_list_offsets_checks_the_current_leader_epoch(module_broker, filled, version):
    bs = module_broker.bootstrap
    assert list_latest_with_epoch(bs, filled, -1, version) == (NONE, RECORDS, 0)
    assert list_latest_with_epoch(bs, filled, 0, version) == (NONE, RECORDS, 0)
    assert list_latest_with_epoch(bs, filled, 1, version)[0] == UNKNOWN_LEADER_EPOCH
    assert list_latest_with_epoch(bs, filled, -2, version)[0] == FENCED_LEADER_EPOCH


def test_metadata_reports_leader_epoch_zero(module_broker, filled):
    req = MetadataRequest[9]
    with Wire(module_broker.bootstrap) as w:
        resp = w.request(req(topics=[req.MetadataRequestTopic(name=filled)], allow_auto_topic_creation=False,
                             include_topic_authorized_operations=False,
                             include_cluster_authorized_operations=False), 9)
    (topic,) = resp.topics
    (p,) = topic.partitions
    assert (p.error_code, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes) == (NONE, 0, 0, [0], [0])


def _ck_read_from(bootstrap: str, topic: str, offset: int, epoch: int, timeout: float = 20.0) -> list[int]:
    """Offsets librdkafka reads after an assign at (offset, leader epoch), up to the end of the partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "epoch-validate", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "enable.partition.eof": True})
    read: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, 0, offset, leader_epoch=epoch)])
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no end of partition in {timeout}s; read {read}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == -191:  # _PARTITION_EOF
                    return read
                continue  # the truncation librdkafka detects is reported as an error event, then it goes on
            read.append(msg.offset())
    finally:
        consumer.close()


def test_librdkafka_validates_a_position_with_its_epoch(broker_factory, topic_name):
    broker = broker_factory(metrics=True)
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    ck_produce(bs, topic_name, [Out(0, None, b"v%d" % i) for i in range(RECORDS)])
    before = metric(scrape(broker.metrics_port), "oncelog_requests_total", api="OFFSET_FOR_LEADER_EPOCH")
    # Inside epoch 0: validated, read from there.
    assert _ck_read_from(bs, topic_name, 5, 0) == list(range(5, RECORDS))
    # Past the end of epoch 0: truncation detected, the position moves to the epoch's end (nothing re-read).
    # Without validation this fetch is OFFSET_OUT_OF_RANGE and auto.offset.reset rereads everything.
    assert _ck_read_from(bs, topic_name, 100, 0) == []
    # An epoch the broker never had: undefined end, reset by policy (earliest).
    assert _ck_read_from(bs, topic_name, 5, 3) == list(range(RECORDS))
    after = metric(scrape(broker.metrics_port), "oncelog_requests_total", api="OFFSET_FOR_LEADER_EPOCH")
    assert after - before >= 3
