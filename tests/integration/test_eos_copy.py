"""An exactly-once copy under broker crashes: Kafka's transactions_test, scaled to one broker.

20,000 records in a 4-partition input topic are copied by a confluent-kafka "copier": a read_committed
consumer in a group (no auto commit) and a transactional producer; every 500 records it produces the
transformed records, sends the consumer's positions with `send_offsets_to_transaction` and commits.
Meanwhile the broker is SIGKILLed and restarted 3 times. On abortable errors the copier aborts and
rewinds to the group's committed offsets; on fatal ones it recreates itself, which resumes from the
committed offsets too. At the end the output, read with read_committed, must equal the transformed
input exactly: every record once, in input order per partition, no loss, no duplicate.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from tests.integration.helpers import Out, ck_consume, ck_produce, create_topic
from tests.integration.test_transactions_rules import READ_COMMITTED, READ_UNCOMMITTED, Txn

log = logging.getLogger(__name__)

RECORDS = 20_000
PARTITIONS = 4
COMMIT_EVERY = 500
KILLS = 3
DEADLINE_S = 180.0
GROUP = "eos-copier"
TXN_ID = "eos-copier-txn"
SETTINGS = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 1000,
}
CLIENT = {
    "metadata.recovery.strategy": "none",  # one broker restarting on the same address: no re-bootstrap
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 500,
    "retry.backoff.ms": 50,
}


def transform(value: bytes) -> bytes:
    return b"copied:" + value


class Copier:
    """consume → produce → send offsets → commit, every COMMIT_EVERY records."""

    def __init__(self, bootstrap: str, source: str, sink: str) -> None:
        self.bootstrap = bootstrap
        self.source = source
        self.sink = sink
        self.pending = 0  # records consumed and produced in the open transaction
        self.progress = 0  # records whose offsets are committed (sum of the group's committed offsets)
        self.events: list[str] = []
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None
        self.in_txn = False
        self.broken = False
        self.create()

    # -- lifecycle -----------------------------------------------------------------------------------
    def create(self) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": GROUP,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                "max.poll.interval.ms": 30000,
                **CLIENT,
            }
        )
        self.consumer.subscribe(
            [self.source], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        self.producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": TXN_ID,
                "transaction.timeout.ms": 30000,
                "linger.ms": 5,
                **CLIENT,
            }
        )
        self._retrying(lambda: self.producer.init_transactions(10), "init_transactions")
        self.in_txn = False
        self.pending = 0
        self.broken = False

    def close(self) -> None:
        for closer in (lambda: self.consumer.close(), lambda: self.producer.flush(1)):
            try:
                closer()
            except Exception as exc:  # a broken client: it is being replaced anyway
                self.events.append(f"close: {exc!r}")
        self.consumer = self.producer = None

    def recreate(self, why: str) -> None:
        self.events.append(f"recreate: {why}")
        self.close()
        self.create()

    # -- rebalances: a transaction must not span a change of assignment ---------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.events.append(f"assigned {[p.partition for p in partitions]}")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.events.append(f"revoked {[p.partition for p in partitions]}")
        if self.in_txn:
            # The next assignment starts from the committed offsets: drop what this transaction holds.
            try:
                self.abort("revoked", rewind=False)
            except KafkaException as exc:
                self.events.append(f"abort on revoke failed: {exc.args[0].str()}")
                self.broken = True

    # -- transactions --------------------------------------------------------------------------------
    def _retrying(self, action: Any, what: str, attempts: int = 20) -> Any:
        """Run a producer call again while it fails with a retriable error (e.g. the broker is restarting)."""
        for attempt in range(attempts):
            try:
                return action()
            except KafkaException as exc:
                err = exc.args[0]
                if err.retriable() and not err.fatal() and attempt < attempts - 1:
                    self.events.append(f"{what} retriable: {err.str()}")
                    time.sleep(0.2)
                    continue
                raise
        return None

    def begin(self) -> None:
        if not self.in_txn:
            self.producer.begin_transaction()
            self.in_txn = True

    def abort(self, why: str, rewind: bool = True) -> None:
        self.events.append(f"abort: {why}")
        self._retrying(lambda: self.producer.abort_transaction(10), "abort_transaction")
        self.in_txn = False
        self.pending = 0
        if rewind:
            self.rewind()

    def rewind(self) -> None:
        """Back to the committed offsets: what the aborted transaction consumed is consumed again."""
        assignment = self.consumer.assignment()
        if not assignment:
            return
        committed = self.consumer.committed(assignment, timeout=10)
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

    def commit(self) -> None:
        assignment = self.consumer.assignment()
        positions = self.consumer.position(assignment)
        self._retrying(
            lambda: self.producer.send_offsets_to_transaction(
                positions, self.consumer.consumer_group_metadata(), 10
            ),
            "send_offsets_to_transaction",
        )
        self._retrying(lambda: self.producer.commit_transaction(10), "commit_transaction")
        self.in_txn = False
        self.pending = 0
        self.refresh_progress()

    def refresh_progress(self) -> None:
        tps = [TopicPartition(self.source, p) for p in range(PARTITIONS)]
        committed = self.consumer.committed(tps, timeout=10)
        self.progress = sum(max(tp.offset, 0) for tp in committed)

    # -- the loop ------------------------------------------------------------------------------------
    def step(self) -> None:
        self.begin()
        # Small reads, so a transaction is open for a while and a crash can land while records are being
        # produced as well as while the transaction commits.
        msgs = self.consumer.consume(num_messages=min(50, COMMIT_EVERY - self.pending), timeout=0.5)
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                self.events.append(f"consumer: {err.str()}")
                continue
            self.produce(msg)
            self.pending += 1
        if msgs:
            time.sleep(0.005)  # a copier doing some work: the produce phase of a transaction takes a while
        if self.broken:
            raise RuntimeError("the transaction could not be aborted at a rebalance")
        if self.pending >= COMMIT_EVERY or (self.pending and not msgs):
            self.commit()
        elif not msgs:
            self.refresh_progress()  # nothing left to read: is everything committed?

    def produce(self, msg: Any) -> None:
        while True:
            try:
                self.producer.produce(
                    self.sink, transform(msg.value()), key=msg.key(), partition=msg.partition()
                )
                return
            except BufferError:
                self.producer.poll(0.05)

    def run(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.progress >= RECORDS:
                return
            try:
                self.step()
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    self.recreate(f"fatal {err.str()}")
                elif err.txn_requires_abort():
                    try:
                        self.abort(err.str())
                    except KafkaException as exc2:
                        self.recreate(f"abort failed: {exc2.args[0].str()}")
                else:
                    # Retriable errors that outlived the retries above, or a consumer-side error: start over
                    # from the committed offsets with fresh clients.
                    self.recreate(f"error {err.str()}")
            except RuntimeError as exc:  # e.g. "Consumer closed"
                self.recreate(f"runtime {exc}")
            self.producer.poll(0)
        raise AssertionError(
            f"copy not finished in {DEADLINE_S}s: {self.progress}/{RECORDS} committed; "
            f"last events {self.events[-15:]}"
        )


class Killer(threading.Thread):
    """SIGKILL + restart the broker when the copy passes given progress marks, in a given phase of the
    open transaction: while records are being produced, while it commits, or anywhere."""

    def __init__(self, broker: Any, copier: Copier, marks: list[tuple[int, str]]) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.copier = copier
        self.marks = marks
        self.kills = 0
        self.kill_points: list[tuple[int, int, bool]] = []  # (committed progress, pending records, in a txn)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rnd = random.Random(7)
        try:
            for mark, phase in self.marks:
                deadline = time.monotonic() + 20
                while not self.stop.is_set() and time.monotonic() < deadline:
                    pending = self.copier.pending
                    if self.copier.progress >= mark and (
                        phase == "any"
                        or (phase == "produce" and 0 < pending < COMMIT_EVERY)
                        or (phase == "commit" and pending >= COMMIT_EVERY)
                    ):
                        break
                    time.sleep(0.001)
                if self.stop.is_set():
                    return
                if phase == "any":
                    time.sleep(rnd.uniform(0.0, 0.4))
                self.kill_points.append((self.copier.progress, self.copier.pending, self.copier.in_txn))
                self.broker.restart()  # SIGKILL, then start on the same port and data dir
                self.kills += 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def test_exactly_once_copy_with_broker_crashes(broker_factory, topic_name):
    broker = broker_factory(SETTINGS)
    bootstrap = broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    inputs = [Out(i % PARTITIONS, f"k{i}".encode(), f"v{i:05d}".encode()) for i in range(RECORDS)]
    ck_produce(bootstrap, source, inputs, **{"enable.idempotence": True, "linger.ms": 20})

    started = time.monotonic()
    copier = Copier(bootstrap, source, sink)
    killer = Killer(broker, copier, marks=[(3_000, "produce"), (9_000, "commit"), (15_000, "any")])
    killer.start()
    try:
        copier.run(started + DEADLINE_S)
    finally:
        killer.stop.set()
        killer.join(60)
        if copier.consumer is not None:
            copier.close()
    assert killer.error is None, killer.error
    assert killer.kills == KILLS, f"only {killer.kills} crashes happened during the copy"

    expected = {
        p: [(o.key, transform(o.value)) for o in inputs if o.partition == p] for p in range(PARTITIONS)
    }
    got_recs = ck_consume(
        bootstrap,
        sink,
        {p: 0 for p in range(PARTITIONS)},
        timeout=60,
        **{"isolation.level": "read_committed"},
    )
    got = {p: [(r.key, r.value) for r in got_recs if r.partition == p] for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        if got[p] != expected[p]:
            seen = set()
            dups = [kv for kv in got[p] if kv in seen or seen.add(kv)]
            missing = set(expected[p]) - set(got[p])
            raise AssertionError(
                f"partition {p}: {len(got[p])} records read, {len(expected[p])} expected; "
                f"{len(dups)} duplicates (e.g. {dups[:3]}), "
                f"{len(missing)} missing (e.g. {sorted(missing)[:3]}); "
                f"copier events: {copier.events[-20:]}"
            )
    with Txn(bootstrap) as w:
        for p in range(PARTITIONS):
            assert w.offset(sink, p, READ_COMMITTED) == w.offset(sink, p, READ_UNCOMMITTED), (
                "a hanging transaction"
            )
        assert w.state(TXN_ID) in ("CompleteCommit", "Empty")
    log.info(
        "copy took %.1fs; crashes at (progress, pending, in txn) %s; events: %s",
        time.monotonic() - started,
        killer.kill_points,
        copier.events,
    )
