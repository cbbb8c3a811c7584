"""Real idempotent producers (librdkafka through confluent-kafka, and kafka-python) against the broker's
producer state: zero delivery errors and zero duplicates, every record counted,
- while another thread keeps deleting records up to the high watermark (KIP-360: the broker must keep
  the producer's state, or the producer gets UNKNOWN_PRODUCER_ID / OUT_OF_ORDER_SEQUENCE_NUMBER);
- while the broker is SIGKILLed and restarted mid-stream (retries of batches the broker already wrote
  must be recognised after recovery);
- after an idle period longer than `producer.id.expiration.ms` (the state is gone; the producer's next
  batch is refused with UNKNOWN_PRODUCER_ID and it must recover without a delivery error).

Each payload is unique and gets exactly one delivery report. Only the test's producer writes, so each
partition's high watermark must equal the number of records sent to it (a duplicate would push it up);
what is still in the log (from the log start offset, read_uncommitted) must be exactly the last records
sent to the partition, in send order, at their acknowledged offsets. How each client reacted (its log
lines about producer-id, sequence and epoch errors) is logged as warnings, shown with a failure's report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import OFFSET_END, Producer, TopicPartition
from tests.integration.helpers import (
    Wire,
    admin,
    ck_consume,
    create_topic,
    list_offset_raw,
    metric,
    scrape,
    wait_until,
)

PARTITIONS = 3
EARLIEST, LATEST = -2, -1
RULES = ("unknown_producer", "out_of_order", "duplicates_cached", "duplicates_window", "fenced_epoch")
EXPIRY = {"producer.id.expiration.ms": 2000, "producer.id.expiration.check.interval.ms": 500}

log = logging.getLogger("test.idempotence")


def payload(client: str, i: int) -> bytes:
    return b"%s-%07d" % (client.encode(), i)


def index_of(value: bytes) -> int:
    return int(value.rsplit(b"-", 1)[1])


def offsets(bs: str, topic: str, partition: int) -> tuple[int, int]:
    with Wire(bs) as w:
        e = list_offset_raw(w, topic, partition, EARLIEST)
        latest = list_offset_raw(w, topic, partition, LATEST)
    assert e[0] == 0 and latest[0] == 0
    return e[1], latest[1]


def producers_on(bs: str, topic: str) -> int:
    from kafka.protocol.admin import DescribeProducersRequest

    req = DescribeProducersRequest[0]
    with Wire(bs) as w:
        resp = w.request(req(topics=[req.TopicRequest(name=topic, partition_indexes=list(range(PARTITIONS)))]), 0)
    return sum(len(p.active_producers) for p in resp.topics[0].partitions)


class Deliveries:
    """What the delivery reports said: per record index, (partition, offset) or the error."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: dict[int, tuple[int, int]] = {}
        self.errors: dict[int, str] = {}
        self.reports = Counter()  # index → number of reports (must be 1)

    def success(self, i: int, partition: int, offset: int) -> None:
        with self.lock:
            self.reports[i] += 1
            self.ok[i] = (partition, offset)

    def failure(self, i: int, error: str) -> None:
        with self.lock:
            self.reports[i] += 1
            self.errors[i] = error

    def count(self) -> int:
        with self.lock:
            return len(self.ok) + len(self.errors)


class ClientLog(logging.Handler):
    """Collects the client's log lines about producer-id, sequence and epoch trouble (and how it recovered)."""

    WORDS = ("unknownproducer", "unknown producer", "duplicate", "outoforder", "out of order", "bump", "fatal",
             "retention", "reset", "dupseq", "unkpid", "errseq", "failed", "error_code=")
    QUIET = ("dest: ", "error_code=0,", "beginning partition drain: wait for outstanding requests to finish before "
             "producing to new leader")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        low = text.lower()
        if any(word in low for word in self.WORDS) and not any(q in low for q in self.QUIET):
            self.lines.append(f"{record.name}: {text}")

    def report(self, title: str) -> None:
        log.warning("%s: %d client log lines about producer ids/sequences/epochs", title, len(self.lines))
        for line in self.lines[:40]:
            log.warning("  %s", line[:400])


def verify(bs: str, topic: str, client: str, total: int, d: Deliveries) -> None:
    """Zero errors, one report per record, no duplicate in the log, order per partition = send order.

    Only this producer writes to the topic, so each partition's high watermark must equal the number of
    records sent to it (a duplicate would push it higher), and what is still there (from the log start
    offset, which DeleteRecords may have moved) must be exactly the last records sent to it, in send order.
    """
    assert not d.errors, f"{len(d.errors)} delivery errors, e.g. {list(d.errors.items())[:5]}"
    assert set(d.reports) == set(range(total)), "some records got no delivery report"
    assert all(n == 1 for n in d.reports.values()), "a record was reported more than once"
    sent_to = {p: [i for i in range(total) if i % PARTITIONS == p] for p in range(PARTITIONS)}
    starts = {}
    for p in range(PARTITIONS):
        start, end = offsets(bs, topic, p)
        assert end == len(sent_to[p]), f"partition {p}: high watermark {end}, {len(sent_to[p])} records sent"
        starts[p] = start
        acked = sorted((o, i) for i, (q, o) in d.ok.items() if q == p and o >= 0)
        assert [i for _, i in acked] == sorted(i for _, i in acked), f"partition {p}: offsets out of send order"
        assert len({o for o, _ in acked}) == len(acked), f"partition {p}: an offset acknowledged twice"
    records = ck_consume(bs, topic, starts, timeout=60)
    values = [r.value for r in records]
    dupes = [v for v, n in Counter(values).items() if n > 1]
    assert not dupes, f"{len(dupes)} payloads in the log more than once, e.g. {dupes[:5]}"
    for p in range(PARTITIONS):
        got = [r for r in records if r.partition == p]
        assert [r.offset for r in got] == list(range(starts[p], len(sent_to[p]))), f"partition {p}: gaps"
        want = [payload(client, i) for i in sent_to[p][starts[p]:]]
        assert [r.value for r in got] == want, f"partition {p}: not the records sent, in send order"
    for r in records:
        i = index_of(r.value)
        if d.ok[i][1] >= 0:
            assert d.ok[i] == (r.partition, r.offset), f"record {i} acknowledged at {d.ok[i]}, read at {r.offset}"


# -- the two clients ---------------------------------------------------------------------------------------------


class CkClient:
    name = "ck"

    def __init__(self, bs: str, d: Deliveries, handler: ClientLog, timeout_ms: int = 90000) -> None:
        logger = logging.getLogger("librdkafka.idempotence")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # only the lines ClientLog picks reach the report
        logger.addHandler(handler)
        self.logger = logger
        self.handler = handler
        self.d = d
        self.producer = Producer({
            "bootstrap.servers": bs, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "metadata.recovery.strategy": "none", "message.timeout.ms": timeout_ms, "request.timeout.ms": 10000,
            "retry.backoff.ms": 50, "retry.backoff.max.ms": 300, "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 300, "socket.connection.setup.timeout.ms": 5000,
            "batch.num.messages": 1000, "batch.size": 32768,  # below the tests' segment.bytes
            "debug": "eos", "log_level": 7,
        }, logger=logger)

    def send(self, topic: str, i: int) -> None:
        def report(err: Any, msg: Any) -> None:
            if err is None:
                self.d.success(i, msg.partition(), msg.offset())
            else:
                self.d.failure(i, f"{err.name()}: {err.str()}")

        while True:
            try:
                self.producer.produce(topic, value=payload(self.name, i), partition=i % PARTITIONS,
                                      on_delivery=report)
                break
            except BufferError:
                self.producer.poll(0.05)
        if i % 100 == 0:
            self.producer.poll(0)

    def service(self, seconds: float) -> None:
        """Let delivery reports arrive (librdkafka serves them in poll)."""
        self.producer.poll(seconds)

    def flush(self, timeout: float) -> None:
        remaining = self.producer.flush(timeout)
        assert remaining == 0, f"{remaining} records still queued after {timeout}s"

    def close(self) -> None:
        self.producer.flush(5)
        self.logger.removeHandler(self.handler)


class KpClient:
    name = "kp"

    def __init__(self, bs: str, d: Deliveries, handler: ClientLog, timeout_ms: int = 90000) -> None:
        from kafka import KafkaProducer

        self.logger = logging.getLogger("kafka.producer")
        self.saved = (self.logger.level, self.logger.propagate)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False  # its DEBUG lines dump whole requests; ClientLog keeps the relevant ones
        self.logger.addHandler(handler)
        self.handler = handler
        self.d = d
        self.futures: list[Any] = []
        self.producer = KafkaProducer(
            bootstrap_servers=bs, enable_idempotence=True, acks="all", linger_ms=5,
            max_in_flight_requests_per_connection=5, delivery_timeout_ms=timeout_ms, request_timeout_ms=10000,
            retry_backoff_ms=50, reconnect_backoff_ms=20, reconnect_backoff_max_ms=300,
        )

    def send(self, topic: str, i: int) -> None:
        future = self.producer.send(topic, value=payload(self.name, i), partition=i % PARTITIONS)
        future.add_callback(lambda meta: self.d.success(i, meta.partition, meta.offset))
        future.add_errback(lambda exc: self.d.failure(i, repr(exc)))

    def service(self, seconds: float) -> None:
        time.sleep(seconds)  # kafka-python calls back from its sender thread

    def flush(self, timeout: float) -> None:
        from kafka.errors import KafkaTimeoutError

        try:
            self.producer.flush(timeout)
        except KafkaTimeoutError:
            raise AssertionError(f"records still in flight after {timeout}s; "
                                 f"{len(self.d.errors)} delivery errors so far") from None

    def close(self) -> None:
        try:
            self.producer.close(timeout=5)
        except Exception as exc:  # a failed flush inside close must not hide the test's own failure
            # close() flushes first and raises when that times out, leaving its sender thread running
            log.warning("kafka-python close: %r; force-closing its sender thread", exc)
            sender = getattr(self.producer, "_sender", None)
            if sender is not None and sender.is_alive():
                sender.force_close()
                sender.join(10)
        self.logger.removeHandler(self.handler)
        self.logger.level, self.logger.propagate = self.saved


CLIENTS = {"confluent": CkClient, "kafka-python": KpClient}
# kafka-python is slower per record; both stay well under a minute per scenario
RECORDS = {"confluent": 30000, "kafka-python": 20000}


def produce_paced(client: Any, topic: str, start: int, stop: int, chunk: int, pause: float) -> None:
    for i in range(start, stop):
        client.send(topic, i)
        if (i + 1) % chunk == 0:
            client.service(pause)


# -- (a) DeleteRecords up to the high watermark, over and over ----------------------------------------------------


@pytest.mark.parametrize("which", sorted(CLIENTS))
def test_delete_records_while_producing(broker_factory, topic_name, which):
    # small segments, so deleting records also deletes whole segments (where Kafka once dropped producer state)
    broker = broker_factory({"log.segment.bytes": 65536}, metrics=True)
    bs = broker.bootstrap
    create_topic(bs, topic_name, PARTITIONS)
    d, handler = Deliveries(), ClientLog()
    client = CLIENTS[which](bs, d, handler, timeout_ms=30000)
    total = RECORDS[which]
    stop = threading.Event()
    moved = Counter()
    failures: list[str] = []

    def deleter() -> None:
        """Moves every partition's log start offset to its high watermark as fast as it can."""
        ac = admin(bs) if which == "confluent" else None
        last = {p: 0 for p in range(PARTITIONS)}
        try:
            while not stop.is_set():
                if ac is not None:
                    futures = ac.delete_records([TopicPartition(topic_name, p, OFFSET_END) for p in range(PARTITIONS)])
                    lows = {tp.partition: f.result(timeout=15).low_watermark for tp, f in futures.items()}
                else:
                    lows = raw_delete_to_hwm(bs, topic_name)
                for p, low in lows.items():
                    if low > last[p]:
                        moved[p] += 1
                        last[p] = low
                ready.set()
                time.sleep(0.01)
        except Exception as exc:  # reported by the test, not lost in the thread
            failures.append(repr(exc))

    ready = threading.Event()
    thread = threading.Thread(target=deleter, daemon=True)
    thread.start()
    try:
        # The admin client may take a while to start on a loaded machine: produce only once deletes run.
        assert ready.wait(30) or failures, "the DeleteRecords thread never completed a round"
        produce_paced(client, topic_name, 0, total, chunk=total // 20, pause=0.1)
        client.flush(40)
    finally:
        stop.set()
        thread.join(30)
        client.close()
        handler.report(f"{which}, DeleteRecords")
    assert not failures, failures
    assert all(moved[p] >= 3 for p in range(PARTITIONS)), f"DeleteRecords hardly ran: {dict(moved)}"
    segment_files = list(broker.data_dir.glob(f"{topic_name}-*/*.log"))
    assert all(int(f.stem) > 0 for f in segment_files), "no segment was ever deleted"
    verify(bs, topic_name, client.name, total, d)
    samples = scrape(broker.metrics_port)
    assert metric(samples, "oncelog_producer_state_verdicts_total", rule="unknown_producer") == 0
    assert metric(samples, "oncelog_producer_state_verdicts_total", rule="out_of_order") == 0


def raw_delete_to_hwm(bs: str, topic: str) -> dict[int, int]:
    from kafka.protocol.admin import DeleteRecordsRequest

    req = DeleteRecordsRequest[2]
    t = req.DeleteRecordsTopic
    with Wire(bs) as w:
        resp = w.request(req(topics=[t(name=topic, partitions=[
            t.DeleteRecordsPartition(partition_index=p, offset=-1) for p in range(PARTITIONS)])],
            timeout_ms=10000), 2)
    out = {}
    for p in resp.topics[0].partitions:
        assert p.error_code == 0, p
        out[p.partition_index] = p.low_watermark
    return out


# -- (b) SIGKILL and restart mid-stream ------------------------------------------------------------------------


@pytest.mark.parametrize("which", sorted(CLIENTS))
def test_sigkill_while_producing(broker_factory, topic_name, which):
    broker = broker_factory({"log.segment.bytes": 256 * 1024}, metrics=True)
    bs = broker.bootstrap
    create_topic(bs, topic_name, PARTITIONS)
    d, handler = Deliveries(), ClientLog()
    client = CLIENTS[which](bs, d, handler)
    total = RECORDS[which]
    kills = 3
    failures: list[str] = []

    def chaos() -> None:
        try:
            for k in range(kills):
                target = (k + 1) * total // (kills + 2)
                wait_until(lambda target=target: d.count() >= target, timeout=60, interval=0.01,
                           what=f"{target} deliveries before kill {k + 1}")
                broker.kill()
                time.sleep(0.2)
                broker.start()
        except Exception as exc:
            failures.append(repr(exc))

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        produce_paced(client, topic_name, 0, total, chunk=total // 30, pause=0.05)
        deadline = time.monotonic() + 120
        while thread.is_alive() and time.monotonic() < deadline:
            client.service(0.1)
        client.flush(90)
    finally:
        client.close()
        handler.report(f"{which}, SIGKILL")
    assert not failures, failures
    assert not thread.is_alive()
    assert broker.alive()
    samples = scrape(broker.metrics_port)
    log.warning("%s: broker verdicts since the last restart: %s", which, {
        rule: metric(samples, "oncelog_producer_state_verdicts_total", rule=rule) for rule in RULES})
    verify(bs, topic_name, client.name, total, d)
    assert "Traceback" not in broker.log_tail(100000)


# -- (c) idle longer than producer.id.expiration.ms -------------------------------------------------------------


def expired_caches(metrics_port: int) -> float:
    return metric(scrape(metrics_port), "oncelog_producer_state_verdicts_total", rule="cache_expired") or 0


@pytest.mark.parametrize("deleted", [False, True], ids=["kept", "deleted"])
@pytest.mark.parametrize("which", sorted(CLIENTS))
def test_idle_longer_than_expiration(broker_factory, topic_name, which, deleted):
    """After producer.id.expiration.ms of idleness the broker drops the producer's cached batches but keeps its
    epoch and last sequence (it forgets the producer only after transactional.id.expiration.ms, as KIP-360
    proposes), so the producer continues where it stopped; with `deleted` its records are gone too
    (DeleteRecords to the high watermark during the idle period)."""
    broker = broker_factory(EXPIRY, metrics=True)
    bs = broker.bootstrap
    create_topic(bs, topic_name, PARTITIONS)
    d, handler = Deliveries(), ClientLog()
    # bounded: a client that cannot recover fails its records within 15 s instead of retrying for minutes
    client = CLIENTS[which](bs, d, handler, timeout_ms=15000)
    per_round = 3000
    rounds = 3
    try:
        for r in range(rounds):
            produce_paced(client, topic_name, r * per_round, (r + 1) * per_round, chunk=per_round, pause=0)
            client.flush(20)
            if r < rounds - 1:
                if deleted:
                    raw_delete_to_hwm(bs, topic_name)
                before = expired_caches(broker.metrics_port)
                wait_until(lambda before=before: expired_caches(broker.metrics_port) > before, timeout=10,
                           interval=0.1, what="the broker to expire the idle producer's cached batches")
    finally:
        client.close()
        handler.report(f"{which}, idle > producer.id.expiration.ms, records {'deleted' if deleted else 'kept'}")
    samples = scrape(broker.metrics_port)
    log.warning("%s: broker verdicts: %s", which, {
        rule: metric(samples, "oncelog_producer_state_verdicts_total", rule=rule) for rule in RULES})
    verify(bs, topic_name, client.name, rounds * per_round, d)
