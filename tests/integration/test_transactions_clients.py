"""Transactions with real clients: confluent-kafka (librdkafka) and kafka-python transactional producers.

Commit visible to read_committed consumers, abort invisible to them but visible to read_uncommitted
ones, fencing by a second instance with the same transactional.id, the last stable offset held back
by an open transaction and released by the coordinator's timeout reaper, and the KAFKA-9803 recovery:
a producer whose transaction timed out gets an abortable error, aborts, and its next transaction
commits. Each test records in its assertions exactly how the client reacted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException, Producer
from kafka import KafkaProducer
from kafka import errors as kerrors
from tests.integration.helpers import ck_consume, create_topic, kp_consume
from tests.integration.test_transactions_rules import READ_COMMITTED, READ_UNCOMMITTED, Txn, wait_for
from tests.support.broker import BrokerProcess

REAPER_MS = 300
SETTINGS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": REAPER_MS}
CLIENT_TIMEOUT_MS = 2000  # transaction.timeout.ms of the producers whose transactions time out

COMMITTED = {"isolation.level": "read_committed"}
UNCOMMITTED = {"isolation.level": "read_uncommitted"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(tmp_path_factory.mktemp("txn-clients") / "data", SETTINGS).start()
    yield proc
    if proc.alive():
        proc.stop()


@pytest.fixture
def topic(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    return topic_name


# -- producers --------------------------------------------------------------------------------------------


def ck_txn(bootstrap: str, txn_id: str, **conf: Any) -> Producer:
    base = {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5}
    base.update(conf)
    producer = Producer(base)
    producer.init_transactions(15)
    return producer


def kp_txn(bootstrap: str, txn_id: str, **conf: Any) -> KafkaProducer:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, linger_ms=5, **conf)
    producer.init_transactions()
    return producer


def ck_send(producer: Producer, topic: str, values: list[tuple[int, bytes]]) -> list[Any]:
    """Produce and flush; returns each record's delivery error (None when delivered)."""
    reports: list[Any] = []
    for partition, value in values:
        producer.produce(topic, value, partition=partition, on_delivery=lambda err, _msg: reports.append(err))
    try:
        producer.flush(15)
    except (KafkaException, SystemError):
        # A fatal error surfaces from the poll inside flush() (as a KafkaException, which the
        # delivery-callback wrapper may re-raise as SystemError); the delivery reports are still set.
        pass
    return reports


def kp_send(producer: KafkaProducer, topic: str, values: list[tuple[int, bytes]]) -> list[Any]:
    futures = [producer.send(topic, value, partition=partition) for partition, value in values]
    producer.flush(15)
    outcomes = []
    for f in futures:
        try:
            f.get(15)
            outcomes.append(None)
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


def values_of(
    bootstrap: str, topic: str, isolation: dict[str, str], reader: str = "ck"
) -> list[tuple[int, bytes]]:
    if reader == "ck":
        recs = ck_consume(bootstrap, topic, {0: 0, 1: 0}, **isolation)
    else:
        recs = kp_consume(bootstrap, topic, {0: 0, 1: 0}, isolation_level=isolation["isolation.level"])
    return [(r.partition, r.value) for r in recs]


def batch(prefix: str, n: int = 6) -> list[tuple[int, bytes]]:
    return [(i % 2, f"{prefix}{i}".encode()) for i in range(n)]


def by_partition(values: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """Values in per-partition log order (produce order within a partition)."""
    return sorted(values, key=lambda pv: pv[0])


def kafka_error(exc: BaseException) -> CKError:
    assert isinstance(exc, KafkaException), exc
    return exc.args[0]


# -- commit and abort visibility --------------------------------------------------------------------------


def run_three_transactions(producer_kind: str, bootstrap: str, topic: str, txn_id: str) -> None:
    """Transaction A committed, B aborted, C committed."""
    if producer_kind == "ck":
        p = ck_txn(bootstrap, txn_id)
        for prefix, commit in (("a", True), ("b", False), ("c", True)):
            p.begin_transaction()
            assert ck_send(p, topic, batch(prefix)) == [None] * 6
            (p.commit_transaction if commit else p.abort_transaction)(15)
    else:
        p = kp_txn(bootstrap, txn_id)
        try:
            for prefix, commit in (("a", True), ("b", False), ("c", True)):
                p.begin_transaction()
                assert kp_send(p, topic, batch(prefix)) == [None] * 6
                (p.commit_transaction if commit else p.abort_transaction)()
        finally:
            p.close(5)


@pytest.mark.parametrize("producer_kind", ["ck", "kp"])
def test_commit_visible_abort_invisible(broker, topic, producer_kind):
    run_three_transactions(producer_kind, broker.bootstrap, topic, f"vis-{topic}")
    committed = by_partition(batch("a") + batch("c"))
    everything = by_partition(batch("a") + batch("b") + batch("c"))
    for reader in ("ck", "kp"):
        assert values_of(broker.bootstrap, topic, COMMITTED, reader) == committed, reader
        assert values_of(broker.bootstrap, topic, UNCOMMITTED, reader) == everything, reader
    with Txn(broker.bootstrap) as w:
        for p in (0, 1):
            assert w.offset(topic, p, READ_COMMITTED) == w.offset(topic, p, READ_UNCOMMITTED)


# -- fencing ----------------------------------------------------------------------------------------------


def test_confluent_fenced_by_a_second_instance(broker, topic):
    txn_id = f"fence-{topic}"
    old = ck_txn(broker.bootstrap, txn_id)
    old.begin_transaction()
    assert ck_send(old, topic, batch("zombie", 2)) == [None, None]
    new = ck_txn(broker.bootstrap, txn_id)  # fences `old` and aborts its open transaction
    # The zombie's next produce: INVALID_PRODUCER_EPOCH (47) in the delivery report, and the producer
    # becomes fatally fenced (_FENCED).
    reports = ck_send(old, topic, batch("zombie-late", 2))
    assert reports and all(r is not None and r.code() == CKError.INVALID_PRODUCER_EPOCH for r in reports), (
        reports
    )
    with pytest.raises(KafkaException) as info:
        old.commit_transaction(10)
    err = kafka_error(info.value)
    assert err.fatal() and not err.txn_requires_abort()
    assert err.code() == CKError._FENCED, err
    with pytest.raises(KafkaException) as info:
        old.abort_transaction(10)
    assert kafka_error(info.value).fatal()
    new.begin_transaction()
    assert ck_send(new, topic, batch("new", 2)) == [None, None]
    new.commit_transaction(15)
    assert values_of(broker.bootstrap, topic, COMMITTED) == batch("new", 2)


def test_confluent_zombie_commit_without_produce_is_fatal(broker, topic):
    """The zombie's first request after the fence is EndTxn(COMMIT): PRODUCER_FENCED, fatal."""
    txn_id = f"fence2-{topic}"
    old = ck_txn(broker.bootstrap, txn_id)
    old.begin_transaction()
    assert ck_send(old, topic, batch("zombie", 2)) == [None, None]
    new = ck_txn(broker.bootstrap, txn_id)
    with pytest.raises(KafkaException) as info:
        old.commit_transaction(10)
    err = kafka_error(info.value)
    assert err.fatal() and not err.txn_requires_abort(), err
    assert err.code() in (CKError._FENCED, CKError.PRODUCER_FENCED), err
    new.begin_transaction()
    new.commit_transaction(15)
    assert values_of(broker.bootstrap, topic, COMMITTED) == []
    assert values_of(broker.bootstrap, topic, UNCOMMITTED) == batch("zombie", 2)


def test_kafka_python_fenced_by_a_second_instance(broker, topic):
    txn_id = f"kfence-{topic}"
    old = kp_txn(broker.bootstrap, txn_id)
    new = None
    try:
        old.begin_transaction()
        assert kp_send(old, topic, batch("zombie", 2)) == [None, None]
        new = kp_txn(broker.bootstrap, txn_id)
        # The zombie's produce fails with INVALID_PRODUCER_EPOCH; kafka-python then tries to bump its
        # epoch with InitProducerId(pid, epoch), which the coordinator answers PRODUCER_FENCED: fatal.
        outcomes = kp_send(old, topic, batch("zombie-late", 2))
        assert all(isinstance(o, kerrors.InvalidProducerEpochError) for o in outcomes), outcomes
        fatal = wait_for(
            lambda: isinstance(old._transaction_manager.last_error, kerrors.ProducerFencedError),
            what="kafka-python to become fenced",
        )
        assert fatal
        with pytest.raises(kerrors.KafkaError) as info:
            old.commit_transaction()
        assert "ProducerFencedError" in str(info.value)
        with pytest.raises(kerrors.KafkaError):
            old.abort_transaction()
        new.begin_transaction()
        assert kp_send(new, topic, batch("new", 2)) == [None, None]
        new.commit_transaction()
        assert values_of(broker.bootstrap, topic, COMMITTED, "kp") == batch("new", 2)
    finally:
        old.close(2)
        if new is not None:
            new.close(5)


# -- LSO held by an open transaction, released by the reaper ----------------------------------------------


@pytest.mark.parametrize("producer_kind", ["ck", "kp"])
def test_open_transaction_holds_the_lso_until_the_reaper_aborts_it(broker, topic, producer_kind):
    bootstrap = broker.bootstrap
    txn_id = f"lso-{topic}"
    if producer_kind == "ck":
        p: Any = ck_txn(bootstrap, txn_id, **{"transaction.timeout.ms": CLIENT_TIMEOUT_MS})
        send: Callable = ck_send
        commit: Callable = lambda: p.commit_transaction(15)  # noqa: E731
    else:
        p = kp_txn(bootstrap, txn_id, transaction_timeout_ms=CLIENT_TIMEOUT_MS)
        send = kp_send
        commit = p.commit_transaction
    try:
        p.begin_transaction()
        assert send(p, topic, batch("first", 2)) == [None, None]
        commit()
        p.begin_transaction()
        opened = time.monotonic()
        assert send(p, topic, batch("open", 4)) == [None] * 4
        with Txn(bootstrap) as w:
            assert [w.offset(topic, q, READ_COMMITTED) for q in (0, 1)] == [2, 2]  # after 'first' + marker
            assert [w.offset(topic, q, READ_UNCOMMITTED) for q in (0, 1)] == [4, 4]
            assert values_of(bootstrap, topic, COMMITTED) == batch("first", 2)
            # The reaper aborts the transaction after transaction.timeout.ms and releases the LSO.
            wait_for(
                lambda: w.offset(topic, 0, READ_COMMITTED) == w.offset(topic, 0, READ_UNCOMMITTED) == 5,
                timeout=CLIENT_TIMEOUT_MS / 1000 + 10,
                what="the reaper",
            )
            assert time.monotonic() - opened >= CLIENT_TIMEOUT_MS / 1000 - 0.6
            assert [w.offset(topic, q, READ_COMMITTED) for q in (0, 1)] == [5, 5]
            # CompleteAbort is written once every marker is in (and durable): on a loaded machine a moment after
            # the last partition's LSO moved, so it is waited for, not read once.
            wait_for(lambda: w.state(txn_id) == "CompleteAbort", timeout=10, what="CompleteAbort")
        assert values_of(bootstrap, topic, COMMITTED) == batch("first", 2)
        assert values_of(bootstrap, topic, UNCOMMITTED) == by_partition(batch("first", 2) + batch("open", 4))
        assert values_of(bootstrap, topic, COMMITTED, "kp") == batch("first", 2)
    finally:
        if producer_kind == "kp":
            p.close(2)


# -- KAFKA-9803: timeout recovery -------------------------------------------------------------------------


@pytest.mark.parametrize("next_step", ["produce", "commit"])
def test_confluent_recovers_from_a_timed_out_transaction(broker, topic, next_step):
    bootstrap = broker.bootstrap
    txn_id = f"recover-{next_step}-{topic}"
    p = ck_txn(bootstrap, txn_id, **{"transaction.timeout.ms": CLIENT_TIMEOUT_MS})
    p.begin_transaction()
    assert ck_send(p, topic, batch("lost", 2)) == [None, None]
    with Txn(bootstrap) as w:
        wait_for(
            lambda: w.state(txn_id) == "CompleteAbort",
            timeout=CLIENT_TIMEOUT_MS / 1000 + 10,
            what="the reaper",
        )
    if next_step == "produce":
        # The next produce at the old epoch: UNKNOWN_PRODUCER_ID in the delivery report; abortable.
        reports = ck_send(p, topic, [(0, b"late")])
        assert [r.code() if r else None for r in reports] == [CKError.UNKNOWN_PRODUCER_ID], reports
    with pytest.raises(KafkaException) as info:
        p.commit_transaction(15)
    err = kafka_error(info.value)
    assert err.txn_requires_abort() and not err.fatal(), err
    assert err.code() == CKError.UNKNOWN_PRODUCER_ID, err
    p.abort_transaction(15)  # EndTxn(ABORT) + InitProducerId(pid, old epoch): the bumped epoch
    p.begin_transaction()
    assert ck_send(p, topic, batch("recovered", 4)) == [None] * 4
    p.commit_transaction(15)
    assert values_of(bootstrap, topic, COMMITTED) == by_partition(batch("recovered", 4))
    # Once more, to be sure the producer is healthy (sequences, epoch).
    p.begin_transaction()
    assert ck_send(p, topic, batch("again", 2)) == [None, None]
    p.commit_transaction(15)
    assert values_of(bootstrap, topic, COMMITTED) == by_partition(batch("recovered", 4) + batch("again", 2))


def test_kafka_python_after_a_timed_out_transaction_produce(broker, topic):
    """kafka-python handles UNKNOWN_PRODUCER_ID on Produce by bumping the epoch itself (KIP-360 path),
    dropping its local transaction: the old transaction's commit/abort then raise, the next one commits."""
    bootstrap = broker.bootstrap
    txn_id = f"krecover-{topic}"
    p = kp_txn(bootstrap, txn_id, transaction_timeout_ms=CLIENT_TIMEOUT_MS)
    try:
        p.begin_transaction()
        assert kp_send(p, topic, batch("lost", 2)) == [None, None]
        with Txn(bootstrap) as w:
            wait_for(
                lambda: w.state(txn_id) == "CompleteAbort",
                timeout=CLIENT_TIMEOUT_MS / 1000 + 10,
                what="the reaper",
            )
        (outcome,) = kp_send(p, topic, [(0, b"late")])
        assert isinstance(outcome, kerrors.UnknownProducerIdError), outcome
        assert "timed out" in str(outcome)
        wait_for(lambda: not p._transaction_manager.is_bumping_epoch(), what="kafka-python's epoch bump")
        assert p._transaction_manager.last_error is None
        with pytest.raises(kerrors.KafkaError):
            p.commit_transaction()  # the transaction is gone; it must not look committed
        p.begin_transaction()
        assert kp_send(p, topic, batch("recovered", 4)) == [None] * 4
        p.commit_transaction()
        assert values_of(bootstrap, topic, COMMITTED, "kp") == by_partition(batch("recovered", 4))
    finally:
        p.close(2)


def test_kafka_python_after_a_timed_out_transaction_commit(broker, topic):
    """kafka-python treats every non-retriable EndTxn error as fatal: a commit after the timeout cannot be
    recovered in place; a new instance (same transactional.id) takes over and commits."""
    bootstrap = broker.bootstrap
    txn_id = f"krecover2-{topic}"
    p = kp_txn(bootstrap, txn_id, transaction_timeout_ms=CLIENT_TIMEOUT_MS)
    try:
        p.begin_transaction()
        assert kp_send(p, topic, batch("lost", 2)) == [None, None]
        with Txn(bootstrap) as w:
            wait_for(
                lambda: w.state(txn_id) == "CompleteAbort",
                timeout=CLIENT_TIMEOUT_MS / 1000 + 10,
                what="the reaper",
            )
        with pytest.raises(kerrors.KafkaError) as info:
            p.commit_transaction()
        assert "UnknownProducerIdError" in str(info.value)
    finally:
        p.close(2)
    q = kp_txn(bootstrap, txn_id, transaction_timeout_ms=CLIENT_TIMEOUT_MS)
    try:
        q.begin_transaction()
        assert kp_send(q, topic, batch("recovered", 2)) == [None, None]
        q.commit_transaction()
    finally:
        q.close(2)
    assert values_of(bootstrap, topic, COMMITTED, "kp") == batch("recovered", 2)
