"""The transaction coordinator's rules over the raw protocol, with exact error codes.

Each test speaks Kafka's wire protocol through `Wire` (requests encoded by kafka-python's schema
codecs) and checks every answer: the InitProducerId decision table (research/protocol-semantics.md
§4.2, DESIGN.md §3) including retries of a bump across a SIGKILL and epoch exhaustion, the
AddPartitionsToTxn/EndTxn checks (§4.3), the KAFKA-9803 timeout recovery (the owner's answers are
abortable, a zombie's are fatal), KIP-890 partition verification, the read side (last stable offset,
aborted transactions), KIP-664 DescribeTransactions/ListTransactions, WriteTxnMarkers, and the
coordinator's state across a crash.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest, DescribeTransactionsRequest, ListTransactionsRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
)
from kafka.record import MemoryRecords
from tests.support.broker import BrokerProcess
from tests.support.wire import Wire

from oncelog.records.builder import build_batch

# Error codes, written out (not taken from the broker's own enum).
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUEST = 42
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
OPERATION_NOT_ATTEMPTED = 55
UNKNOWN_PRODUCER_ID = 59
PRODUCER_FENCED = 90
TRANSACTIONAL_ID_NOT_FOUND = 105
TRANSACTION_ABORTABLE = 120

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
EXHAUSTED_EPOCH = 32766
MAX_TIMEOUT_MS = 60000
REAPER_MS = 300
SETTINGS = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": REAPER_MS,
    "transaction.max.timeout.ms": MAX_TIMEOUT_MS,
}
FENCED = (PRODUCER_FENCED, -1, -1)


# -- the raw client ---------------------------------------------------------------------------------------


class Txn(Wire):
    """A wire connection with one method per transaction API; answers come back as plain values."""

    def __init__(self, bootstrap: str, software: str | None = None) -> None:
        super().__init__(bootstrap)
        if software is not None:
            # ApiVersions v3 names the client; the broker picks client-specific answers by it.
            resp = self.request(
                ApiVersionsRequest[3](client_software_name=software, client_software_version="1.0.0"), 3
            )
            assert resp.error_code == NONE

    def init(
        self, txn_id: str | None, timeout_ms: int = 60000, pid: int = -1, epoch: int = -1, version: int = 4
    ) -> tuple[int, int, int]:
        kwargs: dict[str, Any] = {"transactional_id": txn_id, "transaction_timeout_ms": timeout_ms}
        if version >= 3:
            kwargs.update(producer_id=pid, producer_epoch=epoch)
        resp = self.request(InitProducerIdRequest[version](**kwargs), version)
        return resp.error_code, resp.producer_id, resp.producer_epoch

    def init_until_done(
        self, txn_id: str, timeout_ms: int = 60000, pid: int = -1, epoch: int = -1, deadline_s: float = 10.0
    ) -> tuple[int, int, int]:
        """Retry while CONCURRENT_TRANSACTIONS, as clients do."""
        deadline = time.monotonic() + deadline_s
        while True:
            answer = self.init(txn_id, timeout_ms, pid, epoch)
            if answer[0] != CONCURRENT_TRANSACTIONS or time.monotonic() > deadline:
                return answer
            time.sleep(0.05)

    def add(
        self, txn_id: str, pid: int, epoch: int, partitions: list[tuple[str, int]], version: int = 3
    ) -> dict[tuple[str, int], int]:
        req = AddPartitionsToTxnRequest[version]
        by_topic: dict[str, list[int]] = {}
        for topic, p in partitions:
            by_topic.setdefault(topic, []).append(p)
        resp = self.request(
            req(
                v3_and_below_transactional_id=txn_id,
                v3_and_below_producer_id=pid,
                v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[
                    req.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                ],
            ),
            version,
        )
        return {
            (t.name, p.partition_index): p.partition_error_code
            for t in resp.results_by_topic_v3_and_below
            for p in t.results_by_partition
        }

    def add_codes(
        self, txn_id: str, pid: int, epoch: int, partitions: list[tuple[str, int]], version: int = 3
    ) -> set[int]:
        return set(self.add(txn_id, pid, epoch, partitions, version).values())

    def add_offsets(self, txn_id: str, pid: int, epoch: int, group: str, version: int = 3) -> int:
        resp = self.request(
            AddOffsetsToTxnRequest[version](
                transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, group_id=group
            ),
            version,
        )
        return resp.error_code

    def txn_offset_commit(
        self, txn_id: str, pid: int, epoch: int, group: str, topic: str, offset: int, version: int = 3
    ) -> int:
        req = TxnOffsetCommitRequest[version]
        t = req.TxnOffsetCommitRequestTopic
        kwargs: dict[str, Any] = dict(
            transactional_id=txn_id,
            group_id=group,
            producer_id=pid,
            producer_epoch=epoch,
            topics=[
                t(
                    name=topic,
                    partitions=[
                        t.TxnOffsetCommitRequestPartition(
                            partition_index=0,
                            committed_offset=offset,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        )
                    ],
                )
            ],
        )
        if version >= 3:
            kwargs.update(generation_id=-1, member_id="", group_instance_id=None)
        resp = self.request(req(**kwargs), version)
        return resp.topics[0].partitions[0].error_code

    def end(self, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
        resp = self.request(
            EndTxnRequest[version](
                transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=commit
            ),
            version,
        )
        return resp.error_code

    def produce(
        self,
        txn_id: str | None,
        topic: str,
        partition: int,
        pid: int,
        epoch: int,
        seq: int,
        values: list[bytes],
        version: int = 9,
        transactional: bool = True,
    ) -> Any:
        batch = build_batch(
            [(b"k", v) for v in values],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=transactional,
        )
        return self.produce_batch(txn_id, topic, partition, batch, version)

    def produce_batch(
        self, txn_id: str | None, topic: str, partition: int, batch: bytes | bytearray, version: int = 9
    ) -> Any:
        req = ProduceRequest[version]
        td = req.TopicProduceData
        resp = self.request(
            req(
                transactional_id=txn_id,
                acks=-1,
                timeout_ms=10000,
                topic_data=[
                    td(
                        name=topic,
                        partition_data=[td.PartitionProduceData(index=partition, records=bytes(batch))],
                    )
                ],
            ),
            version,
        )
        return resp.responses[0].partition_responses[0]

    def plain(self, topic: str, partition: int, values: list[bytes]) -> int:
        """Non-transactional records without a producer id; returns the base offset."""
        r = self.produce_batch(None, topic, partition, build_batch([(None, v) for v in values]))
        assert r.error_code == NONE, r
        return r.base_offset

    def offset(self, topic: str, partition: int, isolation: int, timestamp: int = -1) -> int:
        """ListOffsets v4, by default LATEST: the high watermark (read_uncommitted) or the last stable offset."""
        req = ListOffsetsRequest[4]
        lt = req.ListOffsetsTopic
        resp = self.request(
            req(
                replica_id=-1,
                isolation_level=isolation,
                topics=[
                    lt(
                        name=topic,
                        partitions=[
                            lt.ListOffsetsPartition(
                                partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
                            )
                        ],
                    )
                ],
            ),
            4,
        )
        p = resp.topics[0].partitions[0]
        assert p.error_code == NONE, p
        return p.offset

    def lso(self, topic: str, partition: int = 0) -> int:
        return self.offset(topic, partition, READ_COMMITTED)

    def hwm(self, topic: str, partition: int = 0) -> int:
        return self.offset(topic, partition, READ_UNCOMMITTED)

    def fetch(self, topic: str, partition: int, offset: int, isolation: int) -> Any:
        req = FetchRequest[12]
        ft = req.FetchTopic
        resp = self.request(
            req(
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=1 << 22,
                isolation_level=isolation,
                session_id=0,
                session_epoch=-1,
                rack_id="",
                forgotten_topics_data=[],
                topics=[
                    ft(
                        topic=topic,
                        partitions=[
                            ft.FetchPartition(
                                partition=partition,
                                current_leader_epoch=-1,
                                fetch_offset=offset,
                                last_fetched_epoch=-1,
                                log_start_offset=-1,
                                partition_max_bytes=1 << 22,
                            )
                        ],
                    )
                ],
            ),
            12,
        )
        p = resp.responses[0].partitions[0]
        assert p.error_code == NONE, p
        return p

    def describe(self, txn_id: str) -> Any:
        resp = self.request(DescribeTransactionsRequest[0](transactional_ids=[txn_id]), 0)
        (state,) = resp.transaction_states
        assert state.transactional_id == txn_id
        return state

    def state(self, txn_id: str) -> str:
        return self.describe(txn_id).transaction_state

    def list_txns(
        self, states: list[str] = (), pids: list[int] = (), duration_ms: int = -1, version: int = 1
    ) -> tuple[list[str], dict[str, tuple[int, str]]]:
        kwargs: dict[str, Any] = {"state_filters": list(states), "producer_id_filters": list(pids)}
        if version >= 1:
            kwargs["duration_filter"] = duration_ms
        resp = self.request(ListTransactionsRequest[version](**kwargs), version)
        assert resp.error_code == NONE
        return (
            list(resp.unknown_state_filters),
            {s.transactional_id: (s.producer_id, s.transaction_state) for s in resp.transaction_states},
        )

    def write_marker(
        self, pid: int, epoch: int, commit: bool, topic: str, partitions: list[int], coordinator_epoch: int = 0
    ) -> dict[int, int]:
        req = WriteTxnMarkersRequest[1]
        m = req.WritableTxnMarker
        resp = self.request(
            req(
                markers=[
                    m(
                        producer_id=pid,
                        producer_epoch=epoch,
                        transaction_result=commit,
                        topics=[m.WritableTxnMarkerTopic(name=topic, partition_indexes=partitions)],
                        coordinator_epoch=coordinator_epoch,
                    )
                ]
            ),
            1,
        )
        (marker,) = resp.markers
        return {p.partition_index: p.error_code for t in marker.topics for p in t.partitions}

    def create_topic(self, name: str, partitions: int = 2) -> str:
        ct = CreateTopicsRequest[5]
        resp = self.request(
            ct(
                topics=[
                    ct.CreatableTopic(
                        name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
                    )
                ],
                timeout_ms=10000,
                validate_only=False,
            ),
            5,
        )
        assert resp.topics[0].error_code == NONE, resp
        return name


def records_of(fetched: Any) -> tuple[list[tuple[int, bytes | None]], list[int]]:
    """The data records (offset, value) and the offsets of control batches in a fetch answer."""
    data: list[tuple[int, bytes | None]] = []
    controls: list[int] = []
    if not fetched.records:
        return data, controls
    batches = MemoryRecords(bytes(fetched.records))
    while batches.has_next():
        batch = batches.next_batch()
        if batch is None:
            break
        if batch.is_control_batch:
            controls.append(batch.base_offset)
            continue
        data.extend((r.offset, r.value) for r in batch)
    return data, controls


def aborted_of(fetched: Any) -> list[tuple[int, int]]:
    return sorted((a.producer_id, a.first_offset) for a in (fetched.aborted_transactions or []))


def committed_values(w: Txn, topic: str, partition: int = 0) -> list[bytes | None]:
    """What a read_committed consumer makes of a fetch from offset 0: the data below the LSO, minus the
    transactional batches of aborted transactions (the Java consumer's algorithm)."""
    fetched = w.fetch(topic, partition, 0, READ_COMMITTED)
    pending = sorted(aborted_of(fetched), key=lambda a: a[1])
    aborting: set[int] = set()
    out: list[bytes | None] = []
    batches = MemoryRecords(bytes(fetched.records or b""))
    while batches.has_next():
        batch = batches.next_batch()
        if batch is None:
            break
        while pending and pending[0][1] <= batch.last_offset:
            aborting.add(pending.pop(0)[0])
        if batch.is_control_batch:
            aborting.discard(batch.producer_id)
        elif not (batch.is_transactional and batch.producer_id in aborting):
            out.extend(r.value for r in batch)
    return out


def wait_for(predicate, timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def seed_epoch(data_dir: Path, txn_id: str, epoch: int, settings: dict[str, Any]) -> int:
    """Give `txn_id` a persisted producer epoch (without 32766 round trips): an in-process broker on
    `data_dir` creates the id and writes one transaction-log record with that epoch. Returns the pid."""
    from oncelog.broker.server import Broker
    from oncelog.config import load_broker_config

    async def run() -> int:
        config = load_broker_config(overrides=[f"{k}={v}" for k, v in settings.items()])
        broker = Broker(config, data_dir, port=0)
        await broker.start()
        try:
            coordinator = broker.txn_coordinator
            result = await coordinator.init_producer_id(txn_id, 60000, -1, -1, 4)
            assert result.error == NONE
            meta = coordinator.txns[txn_id]
            target = meta.copy()
            target.producer_epoch = epoch
            assert await coordinator._transition(meta, target) == NONE
            return result.producer_id
        finally:
            await broker.stop()

    return asyncio.run(run())


# -- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(tmp_path_factory.mktemp("txn-rules") / "data", SETTINGS).start()
    yield proc
    if proc.alive():
        proc.stop()


@pytest.fixture
def w(broker):
    conn = Txn(broker.bootstrap, software="oncelog-tests")
    yield conn
    conn.close()


@pytest.fixture
def topic(w, topic_name):
    return w.create_topic(topic_name, 2)


@pytest.fixture
def tid(topic_name):
    return f"txn-{topic_name}"


# -- InitProducerId: the decision table -------------------------------------------------------------------


def test_new_transactional_id_gets_a_new_producer_id_at_epoch_0(w, tid):
    error, pid, epoch = w.init(tid)
    assert (error, epoch) == (NONE, 0) and pid >= 0
    other = w.init(tid + "-b")
    assert other[0] == NONE and other[2] == 0 and other[1] != pid
    for version in (0, 2, 3, 5):
        error, fresh, epoch = w.init(f"{tid}-v{version}", version=version)
        assert (error, epoch) == (NONE, 0) and fresh not in (pid, other[1])
    d = w.describe(tid)
    assert (d.error_code, d.transaction_state, d.producer_id, d.producer_epoch) == (NONE, "Empty", pid, 0)
    assert d.transaction_timeout_ms == 60000


def test_init_without_an_epoch_bumps_and_clears_the_last_epoch(w, tid):
    _, pid, _ = w.init(tid)
    assert w.init(tid) == (NONE, pid, 1)
    assert w.init(tid, version=2) == (NONE, pid, 2)  # v2 carries no pid/epoch: a bump without one
    # The last epoch is -1 after a bump without an epoch: the epoch before it is not a retry, it is fenced.
    assert w.init(tid, pid=pid, epoch=1) == FENCED
    assert w.init(tid, pid=pid, epoch=1, version=3) == (INVALID_PRODUCER_EPOCH, -1, -1)
    assert w.describe(tid).producer_epoch == 2


def test_bump_with_the_current_epoch_and_its_retry(w, tid):
    _, pid, _ = w.init(tid)
    assert w.init(tid, pid=pid, epoch=0) == (NONE, pid, 1)
    # The same request again (the answer was lost): the same answer, no second bump.
    assert w.init(tid, pid=pid, epoch=0) == (NONE, pid, 1)
    assert w.init(tid, pid=pid, epoch=0, version=5) == (NONE, pid, 1)
    assert w.describe(tid).producer_epoch == 1
    assert w.init(tid, pid=pid, epoch=1) == (NONE, pid, 2)
    assert w.init(tid, pid=pid, epoch=1) == (NONE, pid, 2)
    # An older epoch than the last one is a zombie, with the code each version knows.
    assert w.init(tid, pid=pid, epoch=0, version=4) == FENCED
    assert w.init(tid, pid=pid, epoch=0, version=5) == FENCED
    assert w.init(tid, pid=pid, epoch=0, version=3) == (INVALID_PRODUCER_EPOCH, -1, -1)
    # A future epoch, and a producer id that is not this id's, are fenced too.
    assert w.init(tid, pid=pid, epoch=7) == FENCED
    assert w.init(tid, pid=pid + 100_000, epoch=2) == FENCED
    assert w.init(tid, pid=pid + 100_000, epoch=2, version=3) == (INVALID_PRODUCER_EPOCH, -1, -1)
    assert w.describe(tid).producer_epoch == 2


def test_retry_of_a_bump_is_answered_after_a_sigkill(broker_factory, tid, topic_name):
    b = broker_factory(SETTINGS)
    with Txn(b.bootstrap) as w:
        topic = w.create_topic(topic_name, 1)
        _, pid, _ = w.init(tid)
        assert w.init(tid, pid=pid, epoch=0) == (NONE, pid, 1)
    b.restart()  # SIGKILL: the answer above may never have reached the producer
    with Txn(b.bootstrap) as w:
        assert w.init(tid, pid=pid, epoch=0) == (NONE, pid, 1)
        assert w.describe(tid).producer_epoch == 1
        # ... and the producer goes on at that epoch.
        assert w.add_codes(tid, pid, 1, [(topic, 0)]) == {NONE}
        assert w.produce(tid, topic, 0, pid, 1, 0, [b"after-restart"]).error_code == NONE
        assert w.end(tid, pid, 1, True) == NONE
        assert committed_values(w, topic) == [b"after-restart"]
        assert w.init(tid, pid=pid, epoch=1) == (NONE, pid, 2)
        # Producer ids are never handed out twice, also across the crash.
        assert w.init(tid + "-new")[1] != pid


def test_pid_and_epoch_come_together(w, tid):
    _, pid, _ = w.init(tid)
    for version in (3, 4, 5):
        assert w.init(tid, pid=pid, epoch=-1, version=version) == (INVALID_REQUEST, -1, -1)
        assert w.init(tid, pid=-1, epoch=0, version=version) == (INVALID_REQUEST, -1, -1)
    assert w.describe(tid).producer_epoch == 0


def test_empty_transactional_id_is_invalid(w):
    for version in (0, 3, 4):
        assert w.init("", version=version) == (INVALID_REQUEST, -1, -1)


def test_transaction_timeout_bounds(w, tid):
    for timeout in (0, -1, MAX_TIMEOUT_MS + 1):
        assert w.init(tid, timeout_ms=timeout) == (INVALID_TRANSACTION_TIMEOUT, -1, -1)
    error, pid, epoch = w.init(tid, timeout_ms=MAX_TIMEOUT_MS)
    assert (error, epoch) == (NONE, 0)
    # Also for a known id asking for a bump.
    assert w.init(tid, timeout_ms=MAX_TIMEOUT_MS + 1, pid=pid, epoch=0) == (
        INVALID_TRANSACTION_TIMEOUT,
        -1,
        -1,
    )
    assert w.describe(tid).producer_epoch == 0


def test_new_instance_fences_an_ongoing_transaction(w, tid, topic):
    _, pid, _ = w.init(tid)
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    r = w.produce(tid, topic, 0, pid, 0, 0, [b"z1", b"z2"])
    assert r.error_code == NONE
    first = r.base_offset
    assert w.lso(topic) == first
    # A second instance: CONCURRENT_TRANSACTIONS while the open transaction is fenced and aborted ...
    assert w.init(tid) == (CONCURRENT_TRANSACTIONS, -1, -1)
    # ... then the epoch after the fence.
    assert w.init_until_done(tid) == (NONE, pid, 2)
    d = w.describe(tid)
    assert (d.transaction_state, d.producer_epoch, d.topics) == ("Empty", 2, [])
    assert w.lso(topic) == w.hwm(topic)
    assert aborted_of(w.fetch(topic, 0, 0, READ_COMMITTED)) == [(pid, first)]
    assert committed_values(w, topic) == []
    # The zombie at epoch 0 gets fatal answers only, even from a client that is not Java.
    r = w.produce(tid, topic, 0, pid, 0, 2, [b"z3"])
    assert r.error_code == INVALID_PRODUCER_EPOCH
    assert w.end(tid, pid, 0, True) == PRODUCER_FENCED
    assert w.end(tid, pid, 0, True, version=4) == PRODUCER_FENCED
    assert w.end(tid, pid, 0, False) == PRODUCER_FENCED
    assert w.end(tid, pid, 0, True, version=1) == INVALID_PRODUCER_EPOCH
    assert w.add_codes(tid, pid, 0, [(topic, 1)]) == {PRODUCER_FENCED}
    assert w.init(tid, pid=pid, epoch=0) == FENCED
    assert w.hwm(topic, 1) == 0


def test_owner_skipping_endtxn_fences_itself(w, tid, topic):
    """InitProducerId(pid, epoch) while Ongoing: the fence clears the last epoch, so the retry is fenced
    (research §4.2: the reason clients send EndTxn(ABORT) first)."""
    _, pid, _ = w.init(tid)
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    assert w.produce(tid, topic, 0, pid, 0, 0, [b"x"]).error_code == NONE
    assert w.init(tid, pid=pid, epoch=0) == (CONCURRENT_TRANSACTIONS, -1, -1)
    assert w.init_until_done(tid, pid=pid, epoch=0) == FENCED
    assert w.describe(tid).transaction_state == "CompleteAbort"


# -- epoch exhaustion -------------------------------------------------------------------------------------


def test_epoch_exhaustion_rotates_the_producer_id(tmp_path, broker_factory, tid, topic_name):
    pid = seed_epoch(tmp_path / "data", tid, EXHAUSTED_EPOCH - 1, SETTINGS)
    b = broker_factory(SETTINGS)  # the same data dir
    with Txn(b.bootstrap) as w:
        assert w.describe(tid).producer_epoch == EXHAUSTED_EPOCH - 1
        topic = w.create_topic(topic_name, 1)
        assert w.init(tid, pid=pid, epoch=EXHAUSTED_EPOCH - 1) == (NONE, pid, EXHAUSTED_EPOCH)
        # A transaction at the last epoch works.
        assert w.add_codes(tid, pid, EXHAUSTED_EPOCH, [(topic, 0)]) == {NONE}
        assert w.produce(tid, topic, 0, pid, EXHAUSTED_EPOCH, 0, [b"old-pid"]).error_code == NONE
        assert w.end(tid, pid, EXHAUSTED_EPOCH, True) == NONE
        # The next bump hands out a new producer id at epoch 0, never epoch 32767.
        error, new_pid, epoch = w.init(tid, pid=pid, epoch=EXHAUSTED_EPOCH)
        assert (error, epoch) == (NONE, 0) and new_pid != pid
        # Its retry (same old pid and epoch) gets the same answer.
        assert w.init(tid, pid=pid, epoch=EXHAUSTED_EPOCH) == (NONE, new_pid, 0)
    b.restart()
    with Txn(b.bootstrap) as w:
        assert w.init(tid, pid=pid, epoch=EXHAUSTED_EPOCH) == (NONE, new_pid, 0)
        d = w.describe(tid)
        assert (d.producer_id, d.producer_epoch, d.transaction_state) == (new_pid, 0, "Empty")
        assert w.add_codes(tid, new_pid, 0, [(topic, 0)]) == {NONE}
        assert w.produce(tid, topic, 0, new_pid, 0, 0, [b"new-pid"]).error_code == NONE
        assert w.end(tid, new_pid, 0, True) == NONE
        assert committed_values(w, topic) == [b"old-pid", b"new-pid"]
        # The old pid is no longer the id's: coordinator requests with it are refused.
        assert w.end(tid, pid, EXHAUSTED_EPOCH, True) == INVALID_PRODUCER_ID_MAPPING
        assert w.init(tid, pid=new_pid, epoch=0) == (NONE, new_pid, 1)
        # Once the new pid moved on, the rotation's retry is stale (Kafka: last epoch no longer matches).
        assert w.init(tid, pid=pid, epoch=EXHAUSTED_EPOCH) == FENCED


def test_rotation_by_a_new_instance_fences_the_old_pid(tmp_path, broker_factory, tid):
    pid = seed_epoch(tmp_path / "data", tid, EXHAUSTED_EPOCH, SETTINGS)
    b = broker_factory(SETTINGS)
    with Txn(b.bootstrap) as w:
        # A new instance (no pid/epoch) at an exhausted epoch: a new pid at epoch 0.
        error, new_pid, epoch = w.init(tid)
        assert (error, epoch) == (NONE, 0) and new_pid != pid
        # The old instance, holding (pid, 32766), must not get the new instance's identity.
        assert w.init(tid, pid=pid, epoch=EXHAUSTED_EPOCH) == FENCED
        assert w.describe(tid).producer_id == new_pid


def test_timeout_at_the_exhausted_epoch_never_hands_out_32767(tmp_path, broker_factory, tid, topic_name):
    pid = seed_epoch(tmp_path / "data", tid, EXHAUSTED_EPOCH - 1, SETTINGS)
    b = broker_factory(SETTINGS)
    with Txn(b.bootstrap) as w:
        topic = w.create_topic(topic_name, 1)
        assert w.init(tid, timeout_ms=1000, pid=pid, epoch=EXHAUSTED_EPOCH - 1) == (
            NONE,
            pid,
            EXHAUSTED_EPOCH,
        )
        assert w.add_codes(tid, pid, EXHAUSTED_EPOCH, [(topic, 0)]) == {NONE}
        assert w.produce(tid, topic, 0, pid, EXHAUSTED_EPOCH, 0, [b"late"]).error_code == NONE
        wait_for(lambda: w.state(tid) == "CompleteAbort", what="the reaper's abort")
        assert w.end(tid, pid, EXHAUSTED_EPOCH, False) == NONE
        error, new_pid, epoch = w.init(tid, timeout_ms=1000, pid=pid, epoch=EXHAUSTED_EPOCH)
        assert error == NONE
        assert epoch < 32767, "the coordinator handed out the reserved epoch 32767"
        assert (new_pid, epoch) != (pid, EXHAUSTED_EPOCH)
        assert w.add_codes(tid, new_pid, epoch, [(topic, 0)]) == {NONE}
        assert w.produce(tid, topic, 0, new_pid, epoch, 0, [b"next"]).error_code == NONE
        assert w.end(tid, new_pid, epoch, True) == NONE
        assert committed_values(w, topic) == [b"next"]


# -- AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn -----------------------------------------


def test_add_partitions_checks(w, tid, topic):
    _, pid, _ = w.init(tid)
    tps = [(topic, 0), (topic, 1)]
    assert w.add_codes("unknown-" + tid, pid, 0, tps) == {INVALID_PRODUCER_ID_MAPPING}
    assert w.add_codes(tid, pid + 100_000, 0, tps) == {INVALID_PRODUCER_ID_MAPPING}
    assert w.add_codes(tid, pid, 1, tps) == {PRODUCER_FENCED}
    assert w.add_codes(tid, pid, 1, tps, version=2) == {PRODUCER_FENCED}
    assert w.add_codes(tid, pid, 1, tps, version=1) == {INVALID_PRODUCER_EPOCH}
    assert w.add(tid, pid, 0, [(topic, 0), ("no-such-topic", 0)]) == {
        (topic, 0): OPERATION_NOT_ATTEMPTED,
        ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert w.state(tid) == "Empty"
    assert w.add_codes(tid, pid, 0, tps) == {NONE}
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}  # already in: nothing to do
    d = w.describe(tid)
    assert d.transaction_state == "Ongoing" and d.transaction_start_time_ms > 0
    assert [(t.topic, sorted(t.partitions)) for t in d.topics] == [(topic, [0, 1])]
    assert w.end(tid, pid, 0, False) == NONE


def test_add_offsets_and_txn_offset_commit_checks(w, tid, topic):
    group = "g-" + tid
    _, pid, _ = w.init(tid)
    assert w.add_offsets("unknown-" + tid, pid, 0, group) == INVALID_PRODUCER_ID_MAPPING
    assert w.add_offsets(tid, pid + 100_000, 0, group) == INVALID_PRODUCER_ID_MAPPING
    assert w.add_offsets(tid, pid, 1, group) == PRODUCER_FENCED
    assert w.add_offsets(tid, pid, 1, group, version=1) == INVALID_PRODUCER_EPOCH
    # TxnOffsetCommit for a group whose offsets partition is not in the transaction.
    assert w.txn_offset_commit(tid, pid, 0, group, topic, 5, version=3) == INVALID_TXN_STATE
    assert w.txn_offset_commit(tid, pid, 0, group, topic, 5, version=4) == TRANSACTION_ABORTABLE
    assert w.add_offsets(tid, pid, 0, group) == NONE
    assert w.txn_offset_commit(tid, pid, 0, group, topic, 5) == NONE
    assert w.txn_offset_commit(tid, pid, 1, group, topic, 5) == PRODUCER_FENCED
    assert w.end(tid, pid, 0, True) == NONE


def test_end_txn_checks(w, tid, topic):
    _, pid, _ = w.init(tid)
    assert w.end(tid, pid, 0, True) == INVALID_TXN_STATE  # Empty: nothing to end
    assert w.end(tid, pid, 0, False) == INVALID_TXN_STATE
    assert w.end("unknown-" + tid, pid, 0, True) == INVALID_PRODUCER_ID_MAPPING
    assert w.end(tid, pid + 100_000, 0, True) == INVALID_PRODUCER_ID_MAPPING
    assert w.end(tid, pid, 1, True) == PRODUCER_FENCED
    assert w.end(tid, pid, 1, True, version=4) == PRODUCER_FENCED
    assert w.end(tid, pid, 1, True, version=1) == INVALID_PRODUCER_EPOCH
    # Commit, then its retry, then a mismatched abort.
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    assert w.produce(tid, topic, 0, pid, 0, 0, [b"c1"]).error_code == NONE
    assert w.end(tid, pid, 0, True) == NONE
    assert w.state(tid) == "CompleteCommit"
    assert w.end(tid, pid, 0, True) == NONE
    assert w.end(tid, pid, 0, True, version=4) == NONE
    assert w.end(tid, pid, 0, False) == INVALID_TXN_STATE
    # Abort, its retry, then a mismatched commit.
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    assert w.produce(tid, topic, 0, pid, 0, 1, [b"a1"]).error_code == NONE
    assert w.end(tid, pid, 0, False) == NONE
    assert w.state(tid) == "CompleteAbort"
    assert w.end(tid, pid, 0, False) == NONE
    assert w.end(tid, pid, 0, True) == INVALID_TXN_STATE
    assert committed_values(w, topic) == [b"c1"]


# -- KAFKA-9803: a transaction that timed out -------------------------------------------------------------


def start_timed_out_transaction(w: Txn, tid: str, topic: str, timeout_ms: int = 1500) -> tuple[int, int]:
    """Init, add both partitions, write one record to partition 0, let the reaper abort it.
    Returns (pid, first offset of the aborted transaction)."""
    _, pid, epoch = w.init(tid, timeout_ms=timeout_ms)
    assert epoch == 0
    assert w.add_codes(tid, pid, 0, [(topic, 0), (topic, 1)]) == {NONE}
    r = w.produce(tid, topic, 0, pid, 0, 0, [b"timed-out"])
    assert r.error_code == NONE
    assert w.lso(topic) == r.base_offset
    started = time.monotonic()
    wait_for(
        lambda: w.state(tid) == "CompleteAbort", timeout=timeout_ms / 1000 + 10, what="the reaper's abort"
    )
    assert time.monotonic() - started >= timeout_ms / 1000 - 0.6  # not aborted long before its timeout
    d = w.describe(tid)
    assert (d.producer_id, d.producer_epoch) == (pid, 1)
    assert w.lso(topic) == w.hwm(topic)  # the reaper released the LSO
    assert aborted_of(w.fetch(topic, 0, 0, READ_COMMITTED)) == [(pid, r.base_offset)]
    return pid, r.base_offset


def test_timeout_recovery_answers_for_the_owner(broker, w, tid, topic):
    pid, _ = start_timed_out_transaction(w, tid, topic)
    # The owner's Produce at its old epoch: abortable for its client, with a message saying why.
    r = w.produce(tid, topic, 0, pid, 0, 1, [b"after-timeout"])
    assert r.error_code == UNKNOWN_PRODUCER_ID, r
    assert "timed out" in (r.error_message or "")
    with Txn(broker.bootstrap, software="apache-kafka-java") as java:
        r = java.produce(tid, topic, 0, pid, 0, 1, [b"after-timeout"])
        assert r.error_code == INVALID_PRODUCER_EPOCH, r
        assert "timed out" in (r.error_message or "")
    # Coordinator requests: UNKNOWN_PRODUCER_ID at every version, because it makes both librdkafka and the
    # Java client abort *and* bump the epoch (Java 4.4 does not bump after TRANSACTION_ABORTABLE here).
    assert w.end(tid, pid, 0, True, version=3) == UNKNOWN_PRODUCER_ID
    assert w.end(tid, pid, 0, True, version=4) == UNKNOWN_PRODUCER_ID
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {UNKNOWN_PRODUCER_ID}
    assert w.add_offsets(tid, pid, 0, "g-" + tid, version=3) == UNKNOWN_PRODUCER_ID
    assert w.add_offsets(tid, pid, 0, "g-" + tid, version=4) == UNKNOWN_PRODUCER_ID
    assert w.hwm(topic) == 2  # the record and the abort marker; nothing else was appended
    # Java's way out: EndTxn(ABORT) succeeds (also retried), then InitProducerId(pid, old epoch).
    assert w.end(tid, pid, 0, False) == NONE
    assert w.end(tid, pid, 0, False, version=4) == NONE
    assert w.init(tid, timeout_ms=1500, pid=pid, epoch=0) == (NONE, pid, 1)
    assert w.init(tid, timeout_ms=1500, pid=pid, epoch=0) == (NONE, pid, 1)
    # The next transaction at the new epoch starts its sequences at 0 and commits.
    assert w.add_codes(tid, pid, 1, [(topic, 0)]) == {NONE}
    r = w.produce(tid, topic, 0, pid, 1, 0, [b"recovered"])
    assert r.error_code == NONE
    assert w.end(tid, pid, 1, True) == NONE
    assert committed_values(w, topic) == [b"recovered"]


def test_timeout_recovery_by_init_producer_id_alone(w, tid, topic):
    """librdkafka's way out of an abortable error that needs an epoch bump: InitProducerId(pid, epoch)."""
    pid, _ = start_timed_out_transaction(w, tid, topic)
    assert w.produce(tid, topic, 0, pid, 0, 1, [b"late"]).error_code == UNKNOWN_PRODUCER_ID
    assert w.init(tid, timeout_ms=1500, pid=pid, epoch=0) == (NONE, pid, 1)
    assert w.add_codes(tid, pid, 1, [(topic, 1)]) == {NONE}
    assert w.produce(tid, topic, 1, pid, 1, 0, [b"recovered"]).error_code == NONE
    assert w.end(tid, pid, 1, True) == NONE
    assert committed_values(w, topic, 1) == [b"recovered"]
    assert committed_values(w, topic, 0) == []


def test_timed_out_owner_writing_a_partition_it_had_added_but_not_written(broker, w, tid, topic):
    """Partition 1 was added before the timeout but got no data (only the reaper's abort marker): the
    owner's first batch there at the old epoch gets the same abortable answer as on partition 0."""
    pid, _ = start_timed_out_transaction(w, tid, topic)
    assert w.hwm(topic, 1) == 1  # the abort marker
    for version in (9, 11):
        r = w.produce(tid, topic, 1, pid, 0, 0, [b"late"], version=version)
        # Produce v11 knows TRANSACTION_ABORTABLE; either abortable answer will do there.
        expected = (UNKNOWN_PRODUCER_ID,) if version < 11 else (UNKNOWN_PRODUCER_ID, TRANSACTION_ABORTABLE)
        assert r.error_code in expected and "timed out" in (r.error_message or ""), r
    with Txn(broker.bootstrap, software="apache-kafka-java") as java:
        r = java.produce(tid, topic, 1, pid, 0, 0, [b"late"])
        assert r.error_code == INVALID_PRODUCER_EPOCH, r
    assert w.hwm(topic, 1) == 1


def test_zombie_after_a_timeout_and_a_new_instance_gets_fatal_answers(w, tid, topic):
    pid, _ = start_timed_out_transaction(w, tid, topic)
    assert w.init(tid, timeout_ms=1500) == (NONE, pid, 2)  # a new instance
    r = w.produce(tid, topic, 0, pid, 0, 1, [b"zombie"])
    assert r.error_code == INVALID_PRODUCER_EPOCH, r
    assert w.produce(tid, topic, 0, pid, 0, 1, [b"zombie"], version=11).error_code == INVALID_PRODUCER_EPOCH
    assert w.end(tid, pid, 0, True, version=3) == PRODUCER_FENCED
    assert w.end(tid, pid, 0, True, version=4) == PRODUCER_FENCED
    assert w.end(tid, pid, 0, False) == PRODUCER_FENCED
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {PRODUCER_FENCED}
    assert w.init(tid, timeout_ms=1500, pid=pid, epoch=0) == FENCED
    assert w.init(tid, timeout_ms=1500, pid=pid, epoch=1) == FENCED  # the reaper's epoch, never handed out
    assert (w.hwm(topic), w.hwm(topic, 1)) == (2, 1)  # data + marker, marker: nothing from the zombie


def test_timeout_that_expires_while_the_broker_is_down(broker_factory, tid, topic_name):
    """The start time and the owner's epoch are persisted: after a SIGKILL the reaper aborts the overdue
    transaction at once, and the owner still recovers instead of being fenced."""
    b = broker_factory(SETTINGS)
    with Txn(b.bootstrap, software="oncelog-tests") as w:
        topic = w.create_topic(topic_name, 1)
        _, pid, _ = w.init(tid, timeout_ms=1000)
        assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
        assert w.produce(tid, topic, 0, pid, 0, 0, [b"x"]).error_code == NONE
    b.kill()
    time.sleep(1.2)
    b.start()
    with Txn(b.bootstrap, software="oncelog-tests") as w:
        wait_for(lambda: w.state(tid) == "CompleteAbort", timeout=5, what="the reaper after the restart")
        assert w.lso(topic) == w.hwm(topic) == 2
        r = w.produce(tid, topic, 0, pid, 0, 1, [b"late"])
        assert r.error_code == UNKNOWN_PRODUCER_ID and "timed out" in (r.error_message or ""), r
        assert w.end(tid, pid, 0, False) == NONE
        assert w.init(tid, timeout_ms=1000, pid=pid, epoch=0) == (NONE, pid, 1)
        assert w.add_codes(tid, pid, 1, [(topic, 0)]) == {NONE}
        assert w.produce(tid, topic, 0, pid, 1, 0, [b"y"]).error_code == NONE
        assert w.end(tid, pid, 1, True) == NONE
        assert committed_values(w, topic) == [b"y"]


# -- KIP-890 part 1: verification -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "expected"), [(9, INVALID_TXN_STATE), (10, INVALID_TXN_STATE), (11, TRANSACTION_ABORTABLE)]
)
def test_batch_for_a_partition_not_in_the_transaction_is_refused(w, tid, topic, version, expected):
    _, pid, _ = w.init(tid)
    # Empty: no transaction at all.
    assert w.produce(tid, topic, 0, pid, 0, 0, [b"x"], version=version).error_code == expected
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    # Ongoing, but partition 1 was never added.
    assert w.produce(tid, topic, 1, pid, 0, 0, [b"x"], version=version).error_code == expected
    # A producer id the coordinator does not know for this transactional id, and a wrong transactional id.
    assert w.produce(tid, topic, 0, pid + 100_000, 0, 0, [b"x"], version=version).error_code == expected
    assert w.produce("other-" + tid, topic, 0, pid, 0, 0, [b"x"], version=version).error_code == expected
    assert (w.hwm(topic, 0), w.hwm(topic, 1)) == (0, 0)
    assert w.produce(tid, topic, 0, pid, 0, 0, [b"ok"], version=version).error_code == NONE
    assert w.end(tid, pid, 0, True) == NONE
    # After the commit a late batch cannot open a new (dangling) transaction.
    assert w.produce(tid, topic, 0, pid, 0, 1, [b"late"], version=version).error_code == expected
    assert (w.hwm(topic, 0), w.hwm(topic, 1)) == (2, 0)
    assert w.lso(topic) == 2


# -- reading: LSO, read_committed fetches, aborted transactions -------------------------------------------


def test_last_stable_offset_and_read_committed_fetch(w, tid, topic):
    assert w.plain(topic, 0, [b"p0", b"p1", b"p2"]) == 0
    _, pid, _ = w.init(tid)
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    assert w.produce(tid, topic, 0, pid, 0, 0, [b"t0", b"t1"]).base_offset == 3
    assert w.plain(topic, 0, [b"p5", b"p6"]) == 5
    assert (w.hwm(topic), w.lso(topic)) == (7, 3)
    committed = w.fetch(topic, 0, 0, READ_COMMITTED)
    assert (committed.high_watermark, committed.last_stable_offset) == (7, 3)
    data, _ = records_of(committed)
    assert data == [(0, b"p0"), (1, b"p1"), (2, b"p2")]
    uncommitted = w.fetch(topic, 0, 0, READ_UNCOMMITTED)
    assert [o for o, _ in records_of(uncommitted)[0]] == [0, 1, 2, 3, 4, 5, 6]
    assert records_of(w.fetch(topic, 0, 3, READ_COMMITTED))[0] == []
    # Commit: the marker goes at 7, everything is stable.
    assert w.end(tid, pid, 0, True) == NONE
    assert (w.hwm(topic), w.lso(topic)) == (8, 8)
    committed = w.fetch(topic, 0, 0, READ_COMMITTED)
    data, controls = records_of(committed)
    assert [v for _, v in data] == [b"p0", b"p1", b"p2", b"t0", b"t1", b"p5", b"p6"]
    assert controls == [7] and aborted_of(committed) == []
    # An aborted transaction: listed with its first offset for readers whose range covers it.
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    assert w.produce(tid, topic, 0, pid, 0, 2, [b"a0", b"a1"]).base_offset == 8
    assert w.plain(topic, 0, [b"p10"]) == 10
    assert w.lso(topic) == 8
    assert w.end(tid, pid, 0, False) == NONE
    assert (w.hwm(topic), w.lso(topic)) == (12, 12)
    for start in (0, 8, 9, 10):
        assert aborted_of(w.fetch(topic, 0, start, READ_COMMITTED)) == [(pid, 8)], start
    assert aborted_of(w.fetch(topic, 0, 12, READ_COMMITTED)) == []
    assert not w.fetch(topic, 0, 0, READ_UNCOMMITTED).aborted_transactions
    assert committed_values(w, topic) == [b"p0", b"p1", b"p2", b"t0", b"t1", b"p5", b"p6", b"p10"]


def test_offsets_by_time_stop_where_the_isolation_level_stops_reading(w, tid, topic):
    """ListOffsets by timestamp and MAX_TIMESTAMP answer "none" (-1) for an offset at or past the last stable
    offset under read_committed (Kafka's lastFetchableOffset), so a read_committed client never gets a position
    inside a transaction that is still open; read_uncommitted is bounded by the high watermark."""
    def plain_at(values_and_times):
        batch = build_batch([(None, v, [], ts) for v, ts in values_and_times])
        r = w.produce_batch(None, topic, 0, batch)
        assert r.error_code == NONE, r

    plain_at([(b"p0", 1000), (b"p1", 1001), (b"p2", 1002)])
    _, pid, _ = w.init(tid)
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    assert w.produce(tid, topic, 0, pid, 0, 0, [b"t0", b"t1"]).base_offset == 3  # timestamps: now
    plain_at([(b"p5", 2000), (b"p6", 2001)])
    assert (w.hwm(topic), w.lso(topic)) == (7, 3)
    max_timestamp = -3
    for isolation, by_1001, by_1500, by_max in ((READ_UNCOMMITTED, 1, 3, {3, 4}), (READ_COMMITTED, 1, -1, {-1})):
        assert w.offset(topic, 0, isolation, 1001) == by_1001
        assert w.offset(topic, 0, isolation, 1500) == by_1500  # the open transaction's first record
        assert w.offset(topic, 0, isolation, max_timestamp) in by_max  # t0 or t1 (same or next millisecond)
    assert w.end(tid, pid, 0, True) == NONE
    assert w.offset(topic, 0, READ_COMMITTED, 1500) == 3
    assert w.offset(topic, 0, READ_COMMITTED, max_timestamp) in {3, 4, 7}  # t0, t1 or the later marker at 7


def test_write_txn_markers_aborts_a_hanging_transaction(w, tid, topic):
    """KIP-664's admin abort: WriteTxnMarkers straight to the partition releases the LSO."""
    _, pid, _ = w.init(tid)
    assert w.add_codes(tid, pid, 0, [(topic, 0)]) == {NONE}
    assert w.produce(tid, topic, 0, pid, 0, 0, [b"h0", b"h1"]).base_offset == 0
    assert w.plain(topic, 0, [b"after"]) == 2
    assert w.lso(topic) == 0
    assert w.write_marker(pid, 0, False, "no-such-topic", [0]) == {0: UNKNOWN_TOPIC_OR_PARTITION}
    assert w.lso(topic) == 0
    assert w.write_marker(pid, 0, False, topic, [0]) == {0: NONE}
    assert (w.hwm(topic), w.lso(topic)) == (4, 4)
    fetched = w.fetch(topic, 0, 0, READ_COMMITTED)
    assert aborted_of(fetched) == [(pid, 0)]
    assert committed_values(w, topic) == [b"after"]


def test_write_txn_markers_refuses_an_older_epoch(w, tid, topic):
    _, pid, _ = w.init(tid)
    assert w.init(tid, pid=pid, epoch=0) == (NONE, pid, 1)
    assert w.add_codes(tid, pid, 1, [(topic, 0)]) == {NONE}
    assert w.produce(tid, topic, 0, pid, 1, 0, [b"h"]).error_code == NONE
    assert w.write_marker(pid, 0, False, topic, [0]) == {0: INVALID_PRODUCER_EPOCH}
    assert w.lso(topic) == 0
    assert w.end(tid, pid, 1, True) == NONE
    assert committed_values(w, topic) == [b"h"]


# -- KIP-664: DescribeTransactions, ListTransactions ------------------------------------------------------


def test_describe_and_list_transactions(broker_factory, topic_name):
    b = broker_factory(SETTINGS)
    with Txn(b.bootstrap) as w:
        topic = w.create_topic(topic_name, 2)
        _, pa, _ = w.init("a", timeout_ms=30000)
        assert w.add_codes("a", pa, 0, [(topic, 0), (topic, 1)]) == {NONE}
        before = int(time.time() * 1000)
        _, pb, _ = w.init("b")
        _, pc, _ = w.init("c")
        assert w.add_codes("c", pc, 0, [(topic, 0)]) == {NONE}
        assert w.end("c", pc, 0, True) == NONE

        d = w.describe("a")
        assert (d.error_code, d.transaction_state, d.producer_id, d.producer_epoch) == (
            NONE,
            "Ongoing",
            pa,
            0,
        )
        assert d.transaction_timeout_ms == 30000
        assert 0 < d.transaction_start_time_ms <= before
        assert [(t.topic, sorted(t.partitions)) for t in d.topics] == [(topic, [0, 1])]
        assert w.describe("c").transaction_state == "CompleteCommit"
        assert w.describe("c").topics == []
        assert w.describe("missing").error_code == TRANSACTIONAL_ID_NOT_FOUND

        everything = {"a": (pa, "Ongoing"), "b": (pb, "Empty"), "c": (pc, "CompleteCommit")}
        assert w.list_txns() == ([], everything)
        assert w.list_txns(version=0) == ([], everything)
        assert w.list_txns(states=["Ongoing"]) == ([], {"a": (pa, "Ongoing")})
        assert w.list_txns(states=["Empty", "CompleteCommit"]) == (
            [],
            {"b": everything["b"], "c": everything["c"]},
        )
        assert w.list_txns(pids=[pb]) == ([], {"b": everything["b"]})
        assert w.list_txns(pids=[pb], states=["Ongoing"]) == ([], {})
        assert w.list_txns(states=["Ongoing", "Bogus"]) == (["Bogus"], {"a": (pa, "Ongoing")})
        time.sleep(0.2)
        assert w.list_txns(duration_ms=100)[1].get("a") == (pa, "Ongoing")
        assert "a" not in w.list_txns(duration_ms=60000)[1]
        assert w.list_txns(states=["Ongoing"], duration_ms=60000) == ([], {})
        # Only an unknown state asked for: it is reported, and no transaction matches it.
        assert w.list_txns(states=["Bogus"]) == (["Bogus"], {})


def test_transactional_id_expiry(broker_factory, topic_name):
    b = broker_factory(
        {
            **SETTINGS,
            "transactional.id.expiration.ms": 500,
            "transaction.remove.expired.transaction.cleanup.interval.ms": 200,
        }
    )
    with Txn(b.bootstrap) as w:
        topic = w.create_topic(topic_name, 1)
        _, pid, _ = w.init("idle", timeout_ms=30000)
        _, opid, _ = w.init("busy", timeout_ms=30000)
        assert w.add_codes("busy", opid, 0, [(topic, 0)]) == {NONE}
        wait_for(lambda: w.describe("idle").error_code == TRANSACTIONAL_ID_NOT_FOUND, what="the id to expire")
        assert w.state("busy") == "Ongoing"  # an open transaction never expires
        # The old instance's coordinator requests: the pid no longer maps to the id (fatal, DESIGN §3).
        assert w.end("idle", pid, 0, True) == INVALID_PRODUCER_ID_MAPPING
        assert w.add_codes("idle", pid, 0, [(topic, 0)]) == {INVALID_PRODUCER_ID_MAPPING}
        error, new_pid, epoch = w.init("idle", timeout_ms=30000)
        assert (error, epoch) == (NONE, 0) and new_pid not in (pid, opid)
    b.restart()
    with Txn(b.bootstrap) as w:
        assert w.describe("idle").producer_id == new_pid
        assert w.state("busy") == "Ongoing"


# -- API versions -----------------------------------------------------------------------------------------


def test_transaction_api_versions_advertised(w):
    resp = w.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
    versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    # No transaction version 2 yet: Produce 12, EndTxn 5 and TxnOffsetCommit 5 must not be offered.
    assert versions[0][1] == 11
    assert versions[26][1] == 4
    assert versions[28][1] == 4
    assert versions[22][1] == 5
    for key in (24, 25, 27, 65, 66):
        assert key in versions


# -- a crash --------------------------------------------------------------------------------------------


def test_transaction_state_survives_sigkill(broker_factory, topic_name):
    b = broker_factory(SETTINGS)
    with Txn(b.bootstrap) as w:
        topic = w.create_topic(topic_name, 2)
        _, px, _ = w.init("open", timeout_ms=60000)
        assert w.add_codes("open", px, 0, [(topic, 0)]) == {NONE}
        assert w.produce("open", topic, 0, px, 0, 0, [b"o1"]).base_offset == 0
        _, py, _ = w.init("done")
        assert w.add_codes("done", py, 0, [(topic, 1)]) == {NONE}
        assert w.produce("done", topic, 1, py, 0, 0, [b"d1"]).error_code == NONE
        assert w.end("done", py, 0, True) == NONE
        started = w.describe("open").transaction_start_time_ms
    b.restart()
    with Txn(b.bootstrap) as w:
        d = w.describe("open")
        assert (d.transaction_state, d.producer_id, d.producer_epoch) == ("Ongoing", px, 0)
        assert d.transaction_start_time_ms == started
        assert [(t.topic, t.partitions) for t in d.topics] == [(topic, [0])]
        assert w.state("done") == "CompleteCommit"
        assert (w.hwm(topic, 0), w.lso(topic, 0)) == (1, 0)
        assert (w.hwm(topic, 1), w.lso(topic, 1)) == (2, 2)
        assert w.end("done", py, 0, True) == NONE  # the retry of the commit
        # The open transaction goes on where it was: next sequence, then commit.
        assert w.produce("open", topic, 0, px, 0, 1, [b"o2"]).error_code == NONE
        assert w.end("open", px, 0, True) == NONE
        assert committed_values(w, topic, 0) == [b"o1", b"o2"]
        assert committed_values(w, topic, 1) == [b"d1"]
