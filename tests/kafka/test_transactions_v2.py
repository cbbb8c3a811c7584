"""The exactly-once Spark sink's transaction protocol on Apache Kafka 4.4, where transaction version 2 (KIP-890
part 2) is finalized: what the sink relies on, pinned against the real broker (docs/transactions-v2.md).

The sink (spark/sink.py, txn_commit.py, markers.py) prepares one transaction per task with oncelog's producer and
lets the driver, another process, end it with EndTxn(COMMIT) naming the task's (producer id, epoch). That rests on
transaction-version-1 rules, which Kafka 4.x applies per request: EndTxn <= v4, Produce <= v11, AddPartitionsToTxn
<= v3. These tests fail when that stops being true: when the fixture no longer finalizes TV2 (so the suite would
silently test something else), when oncelog's clients send a TV2 version, or when Kafka answers the sink's
sequence (prepare, driver commit, repeated commit, retry fencing, abort, timeout) differently. The last tests pin
the TV2 rules themselves (EndTxn v5), which the doc describes for the day the client adopts them.

Every assertion is on what Kafka answers or serves: error codes, DescribeTransactions, offsets, read_committed.
The versions sent are taken from a log of the requests oncelog's connections put on the wire (every request
still goes to Kafka).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from oncelog.client import Admin, Consumer, TopicPartition
from oncelog.client.cluster import Cluster
from oncelog.client.config import ClientConfig
from oncelog.client.connection import BrokerConnection
from oncelog.client.errors import KafkaError
from oncelog.client.producer.sender import PRODUCE_MAX_VERSION, PRODUCE_MIN_VERSION
from oncelog.client.runtime import get_runtime
from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey
from oncelog.spark import markers, sink, txn_ids
from oncelog.spark.sink import SinkCommit
from oncelog.spark.txn_commit import END_TXN_MAX_VERSION, end_transactions
from oncelog.spark.write_options import WriteOptions, parse_write_options

TRANSACTION = 1     # FindCoordinator key type of a transactional id
GROUP = 0
QUERY = "query-1"
DRIVER = "oncelog-sink-driver"      # the driver's client.id: its own cluster view, told apart on the wire
# The highest TV1 version of each transactional API (Kafka: EndTxnRequest / ProduceRequest
# LAST_STABLE_VERSION_BEFORE_TRANSACTION_V2, TransactionVersion.transactionVersionForAddPartitionsToTxn,
# AddPartitionsToTxnManager.txnOffsetCommitRequestVersionToTransactionSupportedOperation).
TV1_MAX = {ApiKey.END_TXN: 4, ApiKey.PRODUCE: 11, ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.TXN_OFFSET_COMMIT: 4,
           ApiKey.ADD_OFFSETS_TO_TXN: 4, ApiKey.INIT_PRODUCER_ID: 5}


# -- helpers ------------------------------------------------------------------------------------------------


@pytest.fixture
def wire(monkeypatch) -> list[tuple[str | None, int, int]]:
    """(client id, api key, version) of every request oncelog's connections send during the test."""
    sent: list[tuple[str | None, int, int]] = []
    real = BrokerConnection.request

    async def request(self, api_key, version, body, **kwargs):
        sent.append((self.client_id, int(api_key), int(version)))
        return await real(self, api_key, version, body, **kwargs)

    monkeypatch.setattr(BrokerConnection, "request", request)
    return sent


def _options(kafka, topic: str, **extra: str) -> WriteOptions:
    with Admin({"bootstrap.servers": kafka.bootstrap}, api_timeout=60) as admin:
        admin.create_topic(topic, 1, 1)
    return parse_write_options({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic, "sink.id": topic,
                                "sink.markerTopic": f"{topic}-markers", **extra})


def _driver(options: WriteOptions) -> WriteOptions:
    """The same sink seen from the driver: another client (its own Cluster and connections)."""
    return dataclasses.replace(options, client={**options.client, "client.id": DRIVER})


def _rows(*values: bytes) -> Iterator[pa.RecordBatch]:
    return iter([pa.RecordBatch.from_pydict({"value": pa.array(list(values), pa.binary())})])


def _task(options: WriteOptions, batch: int, *values: bytes, partition: int = 0) -> SinkCommit:
    """One Spark task's write (sink.write_partition, as the Python worker runs it): a prepared transaction."""
    return sink.write_partition(options, options.sink_id, QUERY, batch, partition, _rows(*values))


def _txid(options: WriteOptions, partition: int = 0) -> str:
    return txn_ids.transactional_id(options.sink_id, partition)


def _describe(kafka, txid: str):
    with Admin({"bootstrap.servers": kafka.bootstrap}, api_timeout=60) as admin:
        return admin.describe_transaction(txid)


def _wait_state(kafka, txid: str, state: str, timeout: float = 40.0):
    deadline = time.monotonic() + timeout
    while True:
        described = _describe(kafka, txid)
        if described.state == state or time.monotonic() > deadline:
            return described
        time.sleep(0.2)


def _commit(kafka, driver: WriteOptions, message: SinkCommit) -> BaseException | None:
    """The driver's EndTxn(COMMIT) (txn_commit.end_transactions); on success, waits until Kafka has written the
    commit markers (CompleteCommit), so what read_committed serves next is the outcome."""
    (outcome,) = end_transactions(driver, [message], commit=True, timeout=30)
    if outcome is None:
        assert message.transactional_id is not None
        assert _wait_state(kafka, message.transactional_id, "CompleteCommit").state == "CompleteCommit"
    return outcome


def _ends(kafka, topic: str) -> tuple[int, int]:
    """(high watermark, last stable offset) of partition 0."""
    tp = TopicPartition(topic, 0)
    with Admin({"bootstrap.servers": kafka.bootstrap}, api_timeout=60) as admin:
        hw = admin.list_offsets({tp: "latest"})[tp].offset
        lso = admin.list_offsets({tp: "latest"}, isolation="read_committed")[tp].offset
    return hw, lso


def _read(kafka, topic: str, isolation: str = "read_committed") -> list[tuple[int, bytes]]:
    """Every (offset, value) of partition 0 a consumer at `isolation` gets, up to the end it may read."""
    tp = TopicPartition(topic, 0)
    hw, lso = _ends(kafka, topic)
    end = lso if isolation == "read_committed" else hw
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        position = 0
        while position < end and time.monotonic() < deadline:
            for message in consumer.consume(100, timeout=0.5):
                assert message.error() is None, message.error()
                got.append((message.offset(), message.value()))
            position = consumer.position([tp])[0].offset
        assert position >= end, f"the {isolation} consumer stopped at {position}, before {end}"
    finally:
        consumer.close()
    return got


def _cluster(kafka, client_id: str) -> Cluster:
    cluster = Cluster(ClientConfig({"bootstrap.servers": kafka.bootstrap, "client.id": client_id}, "admin"))
    get_runtime().run(cluster.bootstrap(), timeout=60)
    return cluster


def _close(cluster: Cluster) -> None:
    get_runtime().run(cluster.close(), timeout=30)


def _coordinator_call(cluster: Cluster, key: str, key_type: int, api: int, data: dict, version: int):
    return get_runtime().run(cluster.coordinator_call(key, key_type, api, data, version=version, timeout=30),
                             timeout=40)


def _end_txn(cluster: Cluster, txid: str, pid: int, epoch: int, commit: bool, version: int):
    """One EndTxn at an exact version (no retries): the response."""
    return _coordinator_call(cluster, txid, TRANSACTION, ApiKey.END_TXN, {
        "transactional_id": txid, "producer_id": pid, "producer_epoch": epoch, "committed": commit}, version)


def _end_txn_settled(cluster: Cluster, txid: str, pid: int, epoch: int, commit: bool, version: int):
    """EndTxn at `version`, asked again while the coordinator is still writing the previous step's markers."""
    deadline = time.monotonic() + 30
    while True:
        resp = _end_txn(cluster, txid, pid, epoch, commit, version)
        if resp.error_code != ErrorCode.CONCURRENT_TRANSACTIONS or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


def _marker_fetch(cluster: Cluster, options: WriteOptions, group: str) -> tuple[int, int]:
    """OffsetFetch(require_stable) of the marker: (partition error code, committed offset)."""
    resp = _coordinator_call(cluster, group, GROUP, ApiKey.OFFSET_FETCH, {
        "group_id": group, "require_stable": True,
        "topics": [{"name": options.marker_topic, "partition_indexes": [markers.MARKER_PARTITION]}]}, 7)
    assert resp.error_code == 0
    (partition,) = resp.topics[0].partitions
    return partition.error_code, partition.committed_offset


def _prepared(kafka, message: SinkCommit, topic: str):
    """The coordinator's view of a prepared task transaction: Ongoing, at the epoch the task reported."""
    assert message.prepared and message.transactional_id is not None
    described = _describe(kafka, message.transactional_id)
    assert (described.state, described.producer_id, described.producer_epoch) == \
        ("Ongoing", message.producer_id, message.epoch)
    assert (topic, 0) in described.partitions
    return described


# -- (a) the fixture is a TV2 cluster -----------------------------------------------------------------------


def test_fixture_finalizes_transaction_version_2(kafka, kafka_runtime):
    """A freshly formatted Kafka 4.4.0 node finalizes transaction.version=2: the ApiVersions answer (where a
    Java producer reads it, TransactionManager.maybeUpdateTransactionV2Enabled) says so, and so does the storage
    tool's feature mapping for the release the fixture formats with (its default, the latest stable)."""
    cluster = _cluster(kafka, "feature-probe")
    try:
        conn = get_runtime().run(cluster.any_connection(), timeout=30)
        resp = get_runtime().run(conn.call(ApiKey.API_VERSIONS, {"client_software_name": "oncelog-tests",
                                                                 "client_software_version": "1"}, version=3),
                                 timeout=30)
    finally:
        _close(cluster)
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in resp.finalized_features}
    assert finalized["transaction.version"] == (2, 2), finalized
    assert finalized["metadata.version"][1] >= 33, finalized      # 4.4-IV2

    java, classpath = kafka_runtime
    out = subprocess.run([java, "-cp", classpath, "kafka.tools.StorageTool", "version-mapping"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mapping = dict(re.findall(r"^([a-z.]+)=(\d+)", out.stdout, re.MULTILINE))
    assert mapping["transaction.version"] == "2", out.stdout
    assert "(4.4-IV2)" in out.stdout, out.stdout


def test_broker_offers_the_transaction_version_2_requests(kafka):
    """Kafka 4.4 advertises the TV2 versions (EndTxn v5, Produce v12+, AddPartitionsToTxn v4+, TxnOffsetCommit
    v5+) to every client: staying on TV1 is the client's choice, made by capping its versions."""
    cluster = _cluster(kafka, "version-probe")
    try:
        offered = get_runtime().run(cluster.any_connection(), timeout=30).api_versions
    finally:
        _close(cluster)
    assert offered[ApiKey.END_TXN][1] >= 5
    assert offered[ApiKey.PRODUCE][1] >= 12
    assert offered[ApiKey.ADD_PARTITIONS_TO_TXN][1] >= 4
    assert offered[ApiKey.TXN_OFFSET_COMMIT][1] >= 5
    # InitProducerId v6 (KIP-939 two-phase commit) is not advertised by 4.4.0
    assert offered[ApiKey.INIT_PRODUCER_ID][1] == 5


# -- (b) oncelog speaks TV1 to it ---------------------------------------------------------------------------


def test_sink_sends_only_transaction_version_1_requests(kafka, topic_name, wire):
    """The whole sink sequence (task prepare, driver commit, driver abort, fencing) on the wire: every
    transactional request is at a TV1 version, the driver's EndTxn included, and the versions are what
    `api_version()` picks on the live connections from the client's caps. The coordinator shows the effect:
    the driver's commit leaves the epoch where the task had it (TV2 would have bumped it)."""
    options = _options(kafka, topic_name)
    driver = _driver(options)
    message = _task(options, 0, b"r0", b"r1", b"r2")
    assert _commit(kafka, driver, message) is None
    committed = _describe(kafka, _txid(options))
    assert (committed.state, committed.producer_id, committed.producer_epoch) == \
        ("CompleteCommit", message.producer_id, message.epoch)

    second = _task(options, 1, b"r3", partition=1)
    sink.undo(driver, options.sink_id, [None, second], "batch 1")     # fence partition 0, EndTxn(ABORT) for 1

    used: dict[int, set[int]] = {}
    for _, api, version in wire:
        used.setdefault(api, set()).add(version)
    for api, highest in TV1_MAX.items():
        assert used.get(api), f"no {ApiKey(api).name} request went out"
        assert max(used[api]) <= highest, (ApiKey(api).name, sorted(used[api]))
    driver_end_txn = {v for client, api, v in wire if client == DRIVER and api == ApiKey.END_TXN}
    assert driver_end_txn == {4}, driver_end_txn

    # The same choice, read from the live connections: the broker offers more, the caps keep TV1.
    cluster, _ = markers.sink_cluster(driver)
    coordinator = get_runtime().run(cluster.coordinator(_txid(options), TRANSACTION), timeout=30)
    assert coordinator.api_versions[ApiKey.END_TXN][1] >= 5
    assert coordinator.api_version(ApiKey.END_TXN, END_TXN_MAX_VERSION) == 4
    leader = get_runtime().run(cluster.leader_connection(topic_name, 0), timeout=30)
    assert leader.api_versions[ApiKey.PRODUCE][1] >= 12
    assert leader.api_version(ApiKey.PRODUCE, PRODUCE_MAX_VERSION, PRODUCE_MIN_VERSION) == 11


# -- (c) the sink's sequence --------------------------------------------------------------------------------


def test_driver_commits_the_transaction_a_task_prepared(kafka, topic_name):
    """Task: init, begin, produce, flush, marker, no commit; reports (pid, epoch). While prepared, nothing is
    readable committed (the open transaction holds the LSO at its first record) and the marker is unstable.
    The driver, another client, commits with the reported (pid, epoch): NONE, the rows become visible once, at
    offsets 0..2, with the marker. Repeating the commit (Spark's commit(N) run twice) answers NONE and writes
    nothing; a replay of the batch finds the marker and skips."""
    options = _options(kafka, topic_name)
    driver = _driver(options)
    assert markers.sink_cluster(driver)[0] is not markers.sink_cluster(options)[0]
    message = _task(options, 7, b"a", b"b", b"c")
    _prepared(kafka, message, topic_name)

    assert _ends(kafka, topic_name) == (3, 0)
    assert _read(kafka, topic_name) == []
    assert _read(kafka, topic_name, "read_uncommitted") == [(0, b"a"), (1, b"b"), (2, b"c")]
    group = txn_ids.marker_group(options.sink_id, 0)
    probe = _cluster(kafka, "marker-probe")
    try:
        assert _marker_fetch(probe, options, group)[0] == ErrorCode.UNSTABLE_OFFSET_COMMIT

        assert _commit(kafka, driver, message) is None
        described = _describe(kafka, message.transactional_id)
        assert (described.state, described.producer_epoch) == ("CompleteCommit", message.epoch)
        assert _read(kafka, topic_name) == [(0, b"a"), (1, b"b"), (2, b"c")]
        ends = _ends(kafka, topic_name)
        assert ends == (4, 4)                                     # three records and the commit marker
        assert _marker_fetch(probe, options, group) == (0, 7)
        assert markers.read_marker(options, group) == markers.Marker(7, QUERY, 3)

        # Spark runs commit(N) twice: the same EndTxn again answers NONE and appends nothing.
        assert end_transactions(driver, [message], commit=True) == [None]
        sink.finish(driver, [message], "batch 7 again")
        assert _ends(kafka, topic_name) == ends
        assert _read(kafka, topic_name) == [(0, b"a"), (1, b"b"), (2, b"c")]
    finally:
        _close(probe)

    replay = _task(options, 7, b"a", b"b", b"c")
    assert replay.skipped and not replay.prepared
    assert _ends(kafka, topic_name) == ends


def test_task_retry_fences_the_earlier_attempt(kafka, topic_name):
    """Attempt 1 prepares and is lost; attempt 2 of the same partition (InitProducerId for the same
    transactional id) fences it: Kafka aborts attempt 1's transaction. The driver's commit with attempt 1's
    (pid, epoch) then fails with PRODUCER_FENCED, and the sink's finish() raises; attempt 1's rows never
    become visible, attempt 2's commit makes its own rows visible once."""
    options = _options(kafka, topic_name)
    driver = _driver(options)
    first = _task(options, 3, b"first-0", b"first-1")
    _prepared(kafka, first, topic_name)

    second = _task(options, 3, b"second-0", b"second-1")
    _prepared(kafka, second, topic_name)
    assert second.producer_id == first.producer_id and second.epoch > first.epoch

    (outcome,) = end_transactions(driver, [first], commit=True, timeout=30)
    assert isinstance(outcome, KafkaError) and outcome.code == ErrorCode.PRODUCER_FENCED, outcome
    with pytest.raises(KafkaError, match="could not commit"):
        sink.finish(driver, [first], "batch 3 (attempt 1)")
    assert _read(kafka, topic_name) == []                 # attempt 1 aborted, attempt 2 still open

    assert _commit(kafka, driver, second) is None
    assert [v for _, v in _read(kafka, topic_name)] == [b"second-0", b"second-1"]
    assert markers.read_marker(options, txn_ids.marker_group(options.sink_id, 0)).batch_id == 3
    # attempt 1's commit stays refused after attempt 2's
    (again,) = end_transactions(driver, [first], commit=True, timeout=30)
    assert isinstance(again, KafkaError) and again.code == ErrorCode.PRODUCER_FENCED, again
    assert [v for _, v in _read(kafka, topic_name)] == [b"second-0", b"second-1"]


def test_commit_in_the_fencing_window_is_fenced(kafka, topic_name):
    """Between a new attempt's first InitProducerId (answered CONCURRENT_TRANSACTIONS while Kafka aborts the
    open transaction, epoch + 1) and its retry, the coordinator sits in CompleteAbort at the old epoch + 1. An
    EndTxn v5 with the old epoch would be taken for a retry there (COMMIT: INVALID_TXN_STATE, ABORT: NONE);
    the driver's v4 commit is plainly fenced."""
    options = _options(kafka, topic_name)
    driver = _driver(options)
    message = _task(options, 0, b"x")
    txid = message.transactional_id
    cluster = _cluster(kafka, "next-attempt")
    try:
        resp = _coordinator_call(cluster, txid, TRANSACTION, ApiKey.INIT_PRODUCER_ID, {
            "transactional_id": txid, "transaction_timeout_ms": options.transaction_timeout_ms,
            "producer_id": -1, "producer_epoch": -1}, 5)
        assert resp.error_code == ErrorCode.CONCURRENT_TRANSACTIONS
    finally:
        _close(cluster)
    window = _wait_state(kafka, txid, "CompleteAbort")
    assert (window.state, window.producer_epoch) == ("CompleteAbort", message.epoch + 1)

    (outcome,) = end_transactions(driver, [message], commit=True, timeout=30)
    assert isinstance(outcome, KafkaError) and outcome.code == ErrorCode.PRODUCER_FENCED, outcome
    assert _read(kafka, topic_name) == []
    assert _ends(kafka, topic_name) == (2, 2)             # the record and the abort marker


# -- (d) the rest of what the sink relies on ---------------------------------------------------------------


def test_driver_abort_and_fence_release_the_last_stable_offset(kafka, topic_name):
    """abort(N): the prepared transactions get EndTxn(ABORT), the partitions whose tasks reported nothing are
    fenced (InitProducerId), so no open transaction pins read_committed consumers until the timeout. Both
    transactions end at once, nothing becomes visible, and an EndTxn(ABORT) repeated answers NONE."""
    options = _options(kafka, topic_name)
    driver = _driver(options)
    reported = _task(options, 5, b"p0-a", b"p0-b")
    silent = _task(options, 5, b"p1-a", partition=1)      # its task died after preparing: no message
    assert _ends(kafka, topic_name) == (3, 0)

    sink.undo(driver, options.sink_id, [reported, None], "batch 5")
    assert _wait_state(kafka, reported.transactional_id, "CompleteAbort").state == "CompleteAbort"
    fenced = _wait_state(kafka, silent.transactional_id, "Empty")
    assert fenced.state == "Empty" and fenced.producer_epoch > silent.epoch
    hw, lso = _ends(kafka, topic_name)
    assert hw == lso == 5                                 # three records, two abort markers
    assert _read(kafka, topic_name) == []
    assert end_transactions(driver, [reported], commit=False) == [None]
    assert _ends(kafka, topic_name) == (hw, lso)


def test_late_commit_after_the_transaction_timeout_fails(kafka, topic_name):
    """A prepared transaction older than transaction.timeout.ms is aborted by the coordinator, which fences its
    epoch (CompleteAbort at epoch + 1); the driver's late commit fails with PRODUCER_FENCED, nothing becomes
    visible, and the batch's replay writes and commits normally (sink.py: "a commit that comes too late
    fails the query, and its restart from the checkpoint replays the batch")."""
    options = _options(kafka, topic_name, **{"transaction.timeout.ms": "2000"})
    driver = _driver(options)
    message = _task(options, 2, b"late")
    aborted = _wait_state(kafka, message.transactional_id, "CompleteAbort", timeout=60)
    assert (aborted.state, aborted.producer_epoch) == ("CompleteAbort", message.epoch + 1)

    (outcome,) = end_transactions(driver, [message], commit=True, timeout=30)
    assert isinstance(outcome, KafkaError) and outcome.code == ErrorCode.PRODUCER_FENCED, outcome
    assert _read(kafka, topic_name) == []

    replay = _task(options, 2, b"late")
    assert replay.prepared and replay.epoch > aborted.producer_epoch
    assert _commit(kafka, driver, replay) is None
    assert [v for _, v in _read(kafka, topic_name)] == [b"late"]


# -- the TV2 rules the doc builds on (EndTxn v5), and why txn_commit caps EndTxn at v4 ---------------------


def test_end_txn_v5_bumps_the_epoch_and_a_repeat_must_use_the_same_version(kafka, topic_name):
    """EndTxn v5 on a transaction the task opened with TV1 requests: NONE with (pid, epoch + 1), the coordinator
    now at epoch + 1; repeated at v5 (epoch one lower than the coordinator's): NONE, the bumped pair again;
    repeated at v4: PRODUCER_FENCED. The other way round, committed at v4 and repeated at v5: INVALID_TXN_STATE.
    A driver that let the version float with the coordinator's could turn Spark's repeated commit(N) into a
    failure; txn_commit therefore never sends v5."""
    options = _options(kafka, topic_name)
    cluster = _cluster(kafka, "raw-end-txn")
    try:
        first = _task(options, 0, b"v5")
        txid, pid, epoch = first.transactional_id, first.producer_id, first.epoch
        resp = _end_txn(cluster, txid, pid, epoch, True, 5)
        assert (resp.error_code, resp.producer_id, resp.producer_epoch) == (0, pid, epoch + 1)
        described = _wait_state(kafka, txid, "CompleteCommit")
        assert (described.state, described.producer_epoch) == ("CompleteCommit", epoch + 1)
        again = _end_txn_settled(cluster, txid, pid, epoch, True, 5)
        assert (again.error_code, again.producer_id, again.producer_epoch) == (0, pid, epoch + 1)
        assert _end_txn_settled(cluster, txid, pid, epoch, True, 4).error_code == ErrorCode.PRODUCER_FENCED
        assert [v for _, v in _read(kafka, topic_name)] == [b"v5"]

        second = _task(options, 1, b"v4")
        pid, epoch = second.producer_id, second.epoch
        assert _end_txn(cluster, txid, pid, epoch, True, 4).error_code == 0
        assert _wait_state(kafka, txid, "CompleteCommit").producer_epoch == epoch
        assert _end_txn_settled(cluster, txid, pid, epoch, True, 5).error_code == ErrorCode.INVALID_TXN_STATE
        assert _end_txn_settled(cluster, txid, pid, epoch, True, 4).error_code == 0
        assert [v for _, v in _read(kafka, topic_name)] == [b"v5", b"v4"]
    finally:
        _close(cluster)


def test_end_txn_v5_with_a_stale_epoch(kafka, topic_name):
    """TV2's stale-epoch answers: after a fence (CompleteAbort at epoch + 1) an old-epoch COMMIT v5 is a
    'retry' of the wrong outcome (INVALID_TXN_STATE) and an old-epoch ABORT v5 a retry of the right one (NONE);
    once the new attempt holds epoch + 2, any older epoch is PRODUCER_FENCED at either version."""
    options = _options(kafka, topic_name)
    cluster = _cluster(kafka, "raw-stale")
    try:
        old = _task(options, 0, b"old")
        txid, pid, epoch = old.transactional_id, old.producer_id, old.epoch
        resp = _coordinator_call(cluster, txid, TRANSACTION, ApiKey.INIT_PRODUCER_ID, {
            "transactional_id": txid, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1}, 5)
        assert resp.error_code == ErrorCode.CONCURRENT_TRANSACTIONS
        assert _wait_state(kafka, txid, "CompleteAbort").producer_epoch == epoch + 1
        assert _end_txn(cluster, txid, pid, epoch, True, 5).error_code == ErrorCode.INVALID_TXN_STATE
        assert _end_txn(cluster, txid, pid, epoch, False, 5).error_code == 0
        assert _end_txn(cluster, txid, pid, epoch, True, 4).error_code == ErrorCode.PRODUCER_FENCED
        assert _end_txn(cluster, txid, pid, epoch, False, 4).error_code == ErrorCode.PRODUCER_FENCED

        new = _task(options, 0, b"new")                  # InitProducerId again: Empty at epoch + 2, then prepared
        assert new.epoch == epoch + 2
        for version in (4, 5):
            for commit in (True, False):
                assert _end_txn(cluster, txid, pid, epoch, commit, version).error_code == ErrorCode.PRODUCER_FENCED
        assert _read(kafka, topic_name) == []
        assert _end_txn(cluster, txid, new.producer_id, new.epoch, False, 4).error_code == 0
    finally:
        _close(cluster)


def test_end_txn_v5_follows_tv2_rules_even_with_transaction_version_1_finalized(kafka_factory, topic_name):
    """The version of the request decides (TransactionVersion.transactionVersionForEndTxn), not the finalized
    feature: on a node formatted with transaction.version=1 the broker still offers EndTxn v5 and bumps the
    epoch for it. Capping the version is the only way a client gets TV1 rules on any Kafka 4.x."""
    node = kafka_factory(features={"transaction.version": 1})
    options = _options(node, topic_name)
    cluster = _cluster(node, "tv1-probe")
    try:
        conn = get_runtime().run(cluster.any_connection(), timeout=30)
        resp = get_runtime().run(conn.call(ApiKey.API_VERSIONS, {"client_software_name": "oncelog-tests",
                                                                 "client_software_version": "1"}, version=3),
                                 timeout=30)
        finalized = {f.name: f.max_version_level for f in resp.finalized_features}
        assert finalized["transaction.version"] == 1
        assert conn.api_versions[ApiKey.END_TXN][1] >= 5

        message = _task(options, 0, b"tv1")
        end = _end_txn(cluster, message.transactional_id, message.producer_id, message.epoch, True, 5)
        assert (end.error_code, end.producer_epoch) == (0, message.epoch + 1)
        assert _wait_state(node, message.transactional_id, "CompleteCommit").producer_epoch == message.epoch + 1
        assert [v for _, v in _read(node, topic_name)] == [b"tv1"]
    finally:
        _close(cluster)
