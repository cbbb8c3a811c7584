"""Storage faults under a real broker: a failed fsync and a full disk.

The rule checked, as Kafka's: the broker refuses writes with KAFKA_STORAGE_ERROR (56) or stops, never
acknowledges what it did not persist, and never shows consumers what it did not persist. After the fault heals
(the disk has room again, or the broker restarted and recovered), production continues, and every record that
was acknowledged is in the log exactly once, at the offset it was acknowledged with.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from confluent_kafka import Producer

from oncelog.records.builder import build_batch
from tests.faults.storage import DiskUnavailable, FsyncTrigger, SmallDisk
from tests.integration.helpers import Wire, ck_consume, create_topic, fetch_raw, produce_raw, wait_until

KAFKA_STORAGE_ERROR = 56
CLEAN_SHUTDOWN_FILE = ".oncelog_cleanshutdown"


class AckedProducer(threading.Thread):
    """An idempotent confluent-kafka producer with acks=all; remembers which values were acknowledged where."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, value_size: int = 200) -> None:
        super().__init__(daemon=True)
        self.topic, self.partitions, self.value_size = topic, partitions, value_size
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[str, tuple[int, int]] = {}
        self.failed: dict[str, str] = {}
        self.sent = 0
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
            "message.timeout.ms": 120_000, "request.timeout.ms": 5_000, "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 500, "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 500,
            "queue.buffering.max.messages": 5_000,
        })

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def _report(self, err, msg) -> None:
        value = msg.value().decode()
        with self.lock:
            if err is None:
                self.acked[value] = (msg.partition(), msg.offset())
            else:
                self.failed[value] = str(err)

    def run(self) -> None:
        n = 0
        pad = "x" * self.value_size
        while not self.stop_event.is_set():
            value = f"v{n}-{pad}"
            try:
                self.producer.produce(self.topic, value.encode(), partition=n % self.partitions,
                                      on_delivery=self._report)
                n += 1
            except BufferError:
                pass
            self.producer.poll(0.002)
        self.sent = n

    def finish(self, timeout: float = 150.0) -> int:
        self.stop_event.set()
        self.join(10)
        return self.producer.flush(timeout)


def read_everything(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, str]]]:
    out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
    for rec in ck_consume(bootstrap, topic, dict.fromkeys(range(partitions), 0), timeout=60):
        out[rec.partition].append((rec.offset, rec.value.decode()))
    return out


def assert_acked_exactly_once(acked: dict[str, tuple[int, int]], log: dict[int, list[tuple[int, str]]]) -> None:
    at = {(p, offset): value for p, records in log.items() for offset, value in records}
    seen: dict[str, int] = {}
    for value in at.values():
        seen[value] = seen.get(value, 0) + 1
    lost = [v for v, place in acked.items() if at.get(place) != v]
    dups = [v for v, count in seen.items() if count > 1]
    assert not lost, f"{len(lost)} acknowledged records are not at their offsets, e.g. {lost[:3]}"
    assert not dups, f"{len(dups)} records are in the log twice, e.g. {dups[:3]}"


def raw_batch(n: int, size: int = 100) -> bytearray:
    return build_batch([(None, f"raw-{n}-".encode() + b"r" * size)])


# -- fsync failure --------------------------------------------------------------------------------------------


def test_failed_fsync_refuses_writes_and_reads_and_recovery_keeps_every_ack(broker_factory, topic_name, tmp_path):
    trigger = FsyncTrigger(tmp_path / "fail-fsync")
    broker = broker_factory(trigger.setting)
    create_topic(broker.bootstrap, topic_name, 2)
    with Wire(broker.bootstrap) as w:
        first = produce_raw(w, topic_name, 0, raw_batch(0))
        assert first.error_code == 0 and first.base_offset == 0
    producer = AckedProducer(broker.bootstrap, topic_name, 2)
    producer.start()
    wait_until(lambda: producer.acked_count() >= 300, timeout=30, what="acks before the fault")

    trigger.arm()
    time.sleep(1.0)  # fsync rounds fail: both partitions (and anything else written) go offline
    acked_at_fault = producer.acked_count()
    with Wire(broker.bootstrap) as w:
        for p in (0, 1):
            refused = produce_raw(w, topic_name, p, raw_batch(1))
            assert refused.error_code == KAFKA_STORAGE_ERROR, refused
            assert refused.base_offset == -1
            fetched = fetch_raw(w, topic_name, p, 0)
            assert fetched.error_code == KAFKA_STORAGE_ERROR, "an offline partition must not serve reads"
    time.sleep(1.0)
    assert producer.acked_count() == acked_at_fault, "acknowledged while every fsync failed"
    trigger.disarm()
    time.sleep(0.5)
    with Wire(broker.bootstrap) as w:
        # The unsynced tail may be gone from the disk: refused until a restart has recovered the log.
        assert produce_raw(w, topic_name, 0, raw_batch(2)).error_code == KAFKA_STORAGE_ERROR
    assert broker.alive()

    code = broker.stop()
    assert code == 0
    assert not (broker.data_dir / CLEAN_SHUTDOWN_FILE).exists(), "an offline log must not be vouched for as clean"
    broker.start()
    assert "recovered after an unclean shutdown" in broker.log_tail(200)
    wait_until(lambda: producer.acked_count() > acked_at_fault + 300, timeout=60, what="production after restart")
    assert producer.finish() == 0
    assert not producer.failed, list(producer.failed.items())[:3]
    log = read_everything(broker.bootstrap, topic_name, 2)
    assert_acked_exactly_once(producer.acked, log)
    assert log[0][0] == (0, "raw-0-" + "r" * 100)
    with Wire(broker.bootstrap) as w:
        assert produce_raw(w, topic_name, 1, raw_batch(3)).error_code == 0


# -- full disk ----------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    disk = SmallDisk(tmp_path / "data", 24)  # the broker's data directory itself; its log file stays outside
    try:
        disk.mount()
    except DiskUnavailable as exc:
        pytest.skip(str(exc))
    yield disk
    disk.free()
    disk.unmount()


def start_on(disk: SmallDisk, broker_factory, settings: dict | None = None):
    base = {"log.segment.bytes": 1 << 20, "transaction.state.log.num.partitions": 2,
            "offsets.topic.num.partitions": 2}
    base.update(settings or {})
    return broker_factory(base, name=disk.path.name)


def test_full_disk_refuses_with_storage_error_and_production_continues(small_disk, broker_factory, topic_name):
    broker = start_on(small_disk, broker_factory)
    create_topic(broker.bootstrap, topic_name, 2)
    producer = AckedProducer(broker.bootstrap, topic_name, 2, value_size=500)
    producer.start()
    wait_until(lambda: producer.acked_count() >= 500, timeout=30, what="acks before the disk fills")

    small_disk.fill()
    time.sleep(1.0)
    with Wire(broker.bootstrap) as w:
        for p in (0, 1):
            refused = produce_raw(w, topic_name, p, raw_batch(10, size=64 * 1024))
            assert refused.error_code == KAFKA_STORAGE_ERROR, refused
            assert refused.base_offset == -1
    stalled = producer.acked_count()
    time.sleep(2.0)
    assert producer.acked_count() - stalled < 50, "a full disk kept acknowledging"
    assert broker.alive()

    small_disk.free()
    wait_until(lambda: producer.acked_count() > stalled + 500, timeout=60, what="production after the disk frees")
    with Wire(broker.bootstrap) as w:
        accepted = produce_raw(w, topic_name, 0, raw_batch(11, size=64 * 1024))
        assert accepted.error_code == 0, accepted
    assert producer.finish() == 0
    assert not producer.failed, list(producer.failed.items())[:3]
    assert_acked_exactly_once(producer.acked, read_everything(broker.bootstrap, topic_name, 2))

    broker.stop()
    broker.start()
    assert_acked_exactly_once(producer.acked, read_everything(broker.bootstrap, topic_name, 2))


def delete_records_raw(bootstrap: str, topic: str, offset: int) -> tuple[int, int]:
    """DeleteRecords on partition 0: (error code, low watermark)."""
    from kafka.protocol.admin import DeleteRecordsRequest

    req = DeleteRecordsRequest[2]
    t = req.DeleteRecordsTopic
    with Wire(bootstrap) as w:
        resp = w.request(req(topics=[t(name=topic, partitions=[
            t.DeleteRecordsPartition(partition_index=0, offset=offset)])], timeout_ms=10000), 2)
    (p,) = resp.topics[0].partitions
    return p.error_code, p.low_watermark


def test_delete_records_on_a_full_disk_is_not_acknowledged(small_disk, broker_factory, topic_name):
    """The new log start offset cannot be checkpointed: the answer is 56, not success and not a dropped
    connection; once there is room, DeleteRecords succeeds."""
    broker = start_on(small_disk, broker_factory)
    create_topic(broker.bootstrap, topic_name, 1)
    with Wire(broker.bootstrap) as w:
        for n in range(10):
            assert produce_raw(w, topic_name, 0, raw_batch(n)).error_code == 0
    small_disk.fill()
    assert delete_records_raw(broker.bootstrap, topic_name, 4) == (KAFKA_STORAGE_ERROR, -1)
    small_disk.free()
    assert delete_records_raw(broker.bootstrap, topic_name, 6) == (0, 6)
    broker.stop()
    broker.start()
    assert delete_records_raw(broker.bootstrap, topic_name, 6) == (0, 6)


def test_aborted_transaction_index_on_a_full_disk_keeps_the_entry(small_disk):
    """An ABORT marker that reached the log must be in the aborted-transaction index at once, even when its
    `.txnindex` file cannot be written: read_committed fetches rely on it. The file is written when there is
    room again; until then syncing it fails, so no snapshot claims it is on disk."""
    from oncelog.storage.txn_index import AbortedTxn, TxnIndex

    directory = small_disk.path / "t-0"
    directory.mkdir()
    index = TxnIndex(directory, "t-0")
    small_disk.fill()
    index.append(AbortedTxn(last_offset=10, producer_id=7, first_offset=3, last_stable_offset=3), 0)
    assert index.collect(0, 11) == [(7, 3)]
    with pytest.raises(OSError):
        index.sync()
    small_disk.free()
    index.append(AbortedTxn(last_offset=20, producer_id=8, first_offset=12, last_stable_offset=12), 0)
    index.sync()
    reloaded = TxnIndex(directory, "t-0")
    reloaded.load()
    assert reloaded.collect(0, 21) == [(7, 3), (8, 12)]


def lso_and_hwm(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    from confluent_kafka import IsolationLevel
    from confluent_kafka import TopicPartition as TP
    from confluent_kafka.admin import AdminClient, OffsetSpec

    client = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TP(topic, p) for p in range(partitions)]
    lso = client.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED)
    hwm = client.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                              isolation_level=IsolationLevel.READ_UNCOMMITTED)
    return [(lso[tp].result(10).offset, hwm[tp].result(10).offset) for tp in tps]


def fill_last_page(broker, topic: str, partition: int, page: int = 4096) -> None:
    """Append a plain batch that ends the active segment exactly at a page boundary, so that on a full tmpfs
    the partition's next append (a transaction marker) cannot be written."""
    segment = max((broker.data_dir / f"{topic}-{partition}").glob("*.log"))
    target = page - segment.stat().st_size % page
    if target < 100:
        target += page
    size = target - 70
    while len(batch := build_batch([(None, b"p" * size)])) != target:
        size += target - len(batch)
    with Wire(broker.bootstrap) as w:
        assert produce_raw(w, topic, partition, batch).error_code == 0
    assert segment.stat().st_size % page == 0


@pytest.mark.parametrize("commit", [False, True])
def test_transaction_ended_on_a_full_disk_neither_hangs_nor_leaks(small_disk, broker_factory, topic_name, commit):
    """End a transaction while the disk is full: the end fails or succeeds, but once there is room again the
    transaction is decided (LSO reaches the high watermark without a restart), read_committed shows its
    records only if it committed, and the producer goes on."""
    broker = start_on(small_disk, broker_factory, {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500})
    create_topic(broker.bootstrap, topic_name, 2)
    conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": f"full-{topic_name}",
            "transaction.timeout.ms": 10_000, "request.timeout.ms": 5_000}
    p = Producer(conf)
    p.init_transactions(30)
    p.begin_transaction()
    for n in range(6):
        p.produce(topic_name, f"in-doubt-{n}".encode(), partition=n % 2)
    assert p.flush(30) == 0
    for partition in (0, 1):  # the markers need a new page of the disk: the disk-full refusal hits them
        fill_last_page(broker, topic_name, partition)
    small_disk.fill()
    try:
        (p.commit_transaction if commit else p.abort_transaction)(8)
        ended = True
    except Exception:  # noqa: BLE001 - refused while the disk is full: fine, as long as nothing leaks
        ended = False
    small_disk.free()
    if not ended:
        try:
            p.abort_transaction(30)
        except Exception:  # noqa: BLE001 - a fatal state: a new instance fences and aborts
            p = Producer(conf)
            p.init_transactions(30)
    wait_until(lambda: all(lso == hwm for lso, hwm in lso_and_hwm(broker.bootstrap, topic_name, 2)),
               timeout=40, what="the transaction decided after the disk freed up")
    p.begin_transaction()
    p.produce(topic_name, b"after", partition=0)
    p.commit_transaction(30)
    seen = [v for records in read_everything(broker.bootstrap, topic_name, 2).values() for _, v in records
            if not v.startswith("ppp")]
    in_doubt = sorted(v for v in seen if v.startswith("in-doubt"))
    assert in_doubt in ([], [f"in-doubt-{n}" for n in range(6)]), f"a transaction half visible: {in_doubt}"
    if ended:
        assert len(in_doubt) == (6 if commit else 0), (commit, in_doubt)
    elif not commit:
        assert not in_doubt, "records of an aborted transaction read under read_committed"
    assert "after" in seen


def init_producer_id(bootstrap: str) -> tuple[int, int]:
    from kafka.protocol.producer import InitProducerIdRequest

    with Wire(bootstrap) as w:
        resp = w.request(InitProducerIdRequest[2](transactional_id=None, transaction_timeout_ms=60000), 2)
    assert resp.error_code == 0, resp
    return resp.producer_id, resp.producer_epoch


def test_retry_of_a_batch_refused_by_a_failed_fsync_is_deduplicated_after_recovery(broker_factory, topic_name,
                                                                                    tmp_path):
    """The batch was written, its fsync failed (56, not acknowledged), the restart recovered it from the page
    cache: the producer's retry (same producer id, epoch, sequence) must get the original offset, not a second
    copy."""
    trigger = FsyncTrigger(tmp_path / "fail-fsync")
    broker = broker_factory(trigger.setting)
    create_topic(broker.bootstrap, topic_name, 1)
    pid, epoch = init_producer_id(broker.bootstrap)

    def batch(seq: int) -> bytearray:
        return build_batch([(None, f"s{seq}".encode())], producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    with Wire(broker.bootstrap) as w:
        for seq in range(3):
            assert produce_raw(w, topic_name, 0, batch(seq)).error_code == 0
        trigger.arm()
        assert produce_raw(w, topic_name, 0, batch(3)).error_code == KAFKA_STORAGE_ERROR
    trigger.disarm()
    broker.stop()
    broker.start()
    with Wire(broker.bootstrap) as w:
        retry = produce_raw(w, topic_name, 0, batch(3))
        assert retry.error_code == 0, retry
        following = produce_raw(w, topic_name, 0, batch(4))
        assert following.error_code == 0, following
    values = [v for _, v in read_everything(broker.bootstrap, topic_name, 1)[0]]
    assert values == ["s0", "s1", "s2", "s3", "s4"], values
    assert retry.base_offset == 3 and following.base_offset == 4


def test_batch_refused_by_a_failed_fsync_does_not_come_back_after_restart(broker_factory, topic_name, tmp_path):
    """56 tells the producer the batch was not written, and a client may then re-send its records under a new
    epoch or producer id (librdkafka bumps the epoch when it believes nothing in flight was persisted). So the
    unsynced tail must not survive into the recovered log, even though the page cache still holds it."""
    trigger = FsyncTrigger(tmp_path / "fail-fsync")
    broker = broker_factory(trigger.setting)
    create_topic(broker.bootstrap, topic_name, 1)
    pid, epoch = init_producer_id(broker.bootstrap)
    with Wire(broker.bootstrap) as w:
        for seq in range(3):
            ok = produce_raw(w, topic_name, 0, build_batch([(None, f"s{seq}".encode())], producer_id=pid,
                                                          producer_epoch=epoch, base_sequence=seq))
            assert ok.error_code == 0
        trigger.arm()
        refused = produce_raw(w, topic_name, 0, build_batch([(None, b"s3")], producer_id=pid,
                                                            producer_epoch=epoch, base_sequence=3))
        assert refused.error_code == KAFKA_STORAGE_ERROR
    trigger.disarm()
    broker.kill()
    broker.start()
    new_pid, new_epoch = init_producer_id(broker.bootstrap)
    with Wire(broker.bootstrap) as w:
        resent = produce_raw(w, topic_name, 0, build_batch([(None, b"s3")], producer_id=new_pid,
                                                           producer_epoch=new_epoch, base_sequence=0))
        assert resent.error_code == 0, resent
    values = [v for _, v in read_everything(broker.bootstrap, topic_name, 1)[0]]
    assert values == ["s0", "s1", "s2", "s3"], values


def test_offline_partition_does_not_answer_a_retry_from_its_producer_cache(broker_factory, topic_name, tmp_path):
    """The batch whose fsync failed is still in the producer-state cache, but it was cut off the log: a retry,
    even with acks=1, gets 56, not the offset of a batch that is not there."""
    trigger = FsyncTrigger(tmp_path / "fail-fsync")
    broker = broker_factory(trigger.setting)
    create_topic(broker.bootstrap, topic_name, 1)
    pid, epoch = init_producer_id(broker.bootstrap)
    batch = build_batch([(None, b"only")], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    with Wire(broker.bootstrap) as w:
        trigger.arm()
        assert produce_raw(w, topic_name, 0, batch, acks=1).error_code == 0  # acks=1: the page cache is enough
        time.sleep(0.5)  # the flusher's round fails: offline, the tail cut
        for acks in (1, -1):
            retry = produce_raw(w, topic_name, 0, batch, acks=acks)
            assert retry.error_code == KAFKA_STORAGE_ERROR, (acks, retry)
