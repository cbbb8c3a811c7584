"""oncelog.fsync.method=syncfs in a running broker (storage/syncfs.py): acks=all answers wait for syncfs rounds,
what was acknowledged is all there after a kill -9 and a recovery, and a failing sync still takes the partitions
offline (KAFKA_STORAGE_ERROR) instead of acknowledging."""

from __future__ import annotations

from confluent_kafka import Producer
from tests.faults.storage import FsyncTrigger
from tests.integration.helpers import Wire, ck_consume, create_topic, metric, scrape, wait_until

PARTITIONS = 4
RECORDS = 2_000
KAFKA_STORAGE_ERROR = 56


def test_syncfs_rounds_acknowledge_keep_every_record_and_fail_closed(broker_factory, topic_name, tmp_path):
    from oncelog.records.builder import build_batch

    trigger = FsyncTrigger(tmp_path / "fail-fsync")
    broker = broker_factory({"oncelog.fsync.method": "syncfs", **trigger.setting}, metrics=True)
    assert "one syncfs per filesystem" in broker.log_tail(200)
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    acked: list[tuple[int, int, str]] = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 2})

    def delivered(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value().decode()))

    for n in range(RECORDS):
        p.produce(topic_name, f"v{n}".encode(), partition=n % PARTITIONS, on_delivery=delivered)
        p.poll(0)
    assert p.flush(60) == 0
    assert len(acked) == RECORDS
    rounds = metric(scrape(broker.metrics_port), "oncelog_fsync_round_seconds_count")
    assert rounds >= 1

    broker.kill()
    broker.start()
    got = {(r.partition, r.offset): r.value.decode() for r in
           ck_consume(broker.bootstrap, topic_name, dict.fromkeys(range(PARTITIONS), 0), timeout=60)}
    assert got == {(part, offset): value for part, offset, value in acked}

    trigger.arm()
    # One request for every partition: their appends share one round of several files, the syncfs path.
    from kafka.protocol.producer import ProduceRequest

    req = ProduceRequest[9]
    td = req.TopicProduceData
    batch = bytes(build_batch([(None, b"after the fault")]))
    message = req(transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[td(name=topic_name, partition_data=[
        td.PartitionProduceData(index=part, records=batch) for part in range(PARTITIONS)])])
    with Wire(broker.bootstrap) as w:
        (answer,) = w.request(message, 9).responses
    assert sorted((r.index, r.error_code) for r in answer.partition_responses) == [
        (part, KAFKA_STORAGE_ERROR) for part in range(PARTITIONS)]
    wait_until(lambda: "fsync failed" in broker.log_tail(400), timeout=10, what="the offline log's reason")
