"""One short test per broker or topic key whose effect had no test of its own (issue 21's audit,
docs/config-keys.md): each sets the key on a real broker and observes what it changes, over the wire or on disk.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest
from kafka.protocol.admin import DeleteTopicsRequest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest
from tests.integration.helpers import (
    Wire,
    create_topic,
    encode_framed,
    fetch_raw,
    produce_raw,
    produce_request,
    wait_until,
)
from tests.integration.test_idempotence_rules import delete_records

from oncelog.records.batch import iter_headers
from oncelog.records.builder import build_batch
from oncelog.storage.checkpoints import RECOVERY_POINT_FILE, read_checkpoint

NONE = 0
TOPIC_DELETION_DISABLED = 73


def one(value: bytes = b"v") -> bytearray:
    return build_batch([(None, value, (), int(time.time() * 1000))])


def files(broker, topic: str) -> list[str]:
    return sorted(p.name for p in (broker.data_dir / f"{topic}-0").iterdir())


def connection_closed(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def test_delete_topic_enable_false_refuses_deletes(broker_factory, topic_name):
    broker = broker_factory({"delete.topic.enable": "false"})
    create_topic(broker.bootstrap, topic_name)
    with Wire(broker.bootstrap) as w:
        resp = w.request(DeleteTopicsRequest[3](topic_names=[topic_name], timeout_ms=10000), 3)
    assert [(r.name, r.error_code) for r in resp.responses] == [(topic_name, TOPIC_DELETION_DISABLED)]


def test_max_connections_closes_the_connection_above_it(broker_factory):
    broker = broker_factory({"max.connections": 2})
    first, second = Wire(broker.bootstrap), Wire(broker.bootstrap)
    try:
        for w in (first, second):
            assert w.request(ApiVersionsRequest[0](), 0).error_code == NONE
        third = socket.create_connection(("127.0.0.1", broker.port))
        assert connection_closed(third, 10)
        third.close()
        first.close()
        wait_until(lambda: _answers(broker.bootstrap), what="a connection once one is free")
    finally:
        second.close()


def _answers(bootstrap: str) -> bool:
    try:
        with Wire(bootstrap, timeout=2) as w:
            return w.request(ApiVersionsRequest[0](), 0).error_code == NONE
    except (ConnectionError, OSError):
        return False


def test_connections_max_idle_ms_closes_idle_connections(broker_factory):
    broker = broker_factory({"connections.max.idle.ms": 600})
    with Wire(broker.bootstrap) as w:
        assert w.request(ApiVersionsRequest[0](), 0).error_code == NONE
        started = time.monotonic()
        assert connection_closed(w.sock, 10)
        assert 0.5 < time.monotonic() - started < 5


def test_fetch_max_bytes_caps_a_fetch_response(broker_factory, topic_name):
    broker = broker_factory({"fetch.max.bytes": 3000})
    create_topic(broker.bootstrap, topic_name)
    with Wire(broker.bootstrap) as w:
        for i in range(6):
            assert produce_raw(w, topic_name, 0, one(b"%d" % i * 1000)).error_code == NONE
        part = fetch_raw(w, topic_name, 0, 0, max_bytes=1 << 20)
    # Whole batches only, at most 3000 bytes (each batch is about 1070): the first two of six.
    assert [h.base_offset for _, h in iter_headers(bytes(part.records))] == [0, 1]


def test_queued_max_requests_stops_reading_behind_a_pending_request(broker_factory, topic_name):
    """With one request allowed in progress, a Produce pipelined behind a long-poll Fetch is not read until the
    Fetch has timed out empty; with the default the Produce is read at once and wakes the Fetch with its record."""
    def pipelined(bootstrap: str) -> tuple[int, float]:
        from kafka.protocol.consumer import FetchRequest

        req = FetchRequest[11]
        ft = req.FetchTopic
        fetch = req(replica_id=-1, max_wait_ms=3000, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                    session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                    topics=[ft(topic=topic_name, partitions=[ft.FetchPartition(
                        partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20,
                        current_leader_epoch=-1)])])
        with Wire(bootstrap) as w:
            started = time.monotonic()
            w.send_raw(encode_framed(fetch, 11, 1))
            time.sleep(0.5)  # the Fetch is read (and parked) first; frames that arrive together are read together
            w.send_raw(encode_framed(produce_request(topic_name, 0, one()), 9, 2))
            frame = w.recv_frame()
            waited = time.monotonic() - started
            assert struct.unpack_from(">i", frame)[0] == 1
            resp = FetchResponse[11].decode(frame[4:])
            w.recv_frame()
        return len(resp.responses[0].partitions[0].records or b""), waited

    default = broker_factory(name="default")
    one_at_a_time = broker_factory({"queued.max.requests": 1}, name="one")
    for broker in (default, one_at_a_time):
        create_topic(broker.bootstrap, topic_name)
    size, waited = pipelined(default.bootstrap)
    assert size > 0 and waited < 2.5
    size, waited = pipelined(one_at_a_time.bootstrap)
    assert size == 0 and waited >= 2.9


def test_log_flush_offset_checkpoint_interval_ms_writes_recovery_points(broker_factory, topic_name):
    broker = broker_factory({"log.flush.offset.checkpoint.interval.ms": 300})
    create_topic(broker.bootstrap, topic_name)
    with Wire(broker.bootstrap) as w:
        for _ in range(3):
            assert produce_raw(w, topic_name, 0, one()).error_code == NONE
    # Nothing else writes the checkpoint between the topic's creation and a stop: only the interval can.
    wait_until(lambda: read_checkpoint(broker.data_dir / RECOVERY_POINT_FILE).get((topic_name, 0)) == 3,
               timeout=10, what="the recovery point checkpoint to reach 3")


def test_file_delete_delay_ms_keeps_deleted_segments_as_dot_deleted(broker_factory, topic_name):
    """log.segment.delete.delay.ms is the broker's default (here 0: unlinked at once); a topic's file.delete.delay.ms
    overrides it (here 1.5 s: renamed to .deleted, then unlinked)."""
    broker = broker_factory({"log.segment.delete.delay.ms": 0})
    delayed = topic_name + "-delayed"
    create_topic(broker.bootstrap, topic_name, config={"segment.bytes": "150"})
    create_topic(broker.bootstrap, delayed, config={"segment.bytes": "150", "file.delete.delay.ms": "1500"})
    with Wire(broker.bootstrap) as w:
        for topic in (topic_name, delayed):
            for _ in range(3):
                assert produce_raw(w, topic, 0, one(b"x" * 60)).error_code == NONE
            assert delete_records(w, topic, 2) == 2
        deleted_at = time.monotonic()
    first = "00000000000000000000"
    assert not any(name.startswith(first) for name in files(broker, topic_name))
    assert [n for n in files(broker, delayed) if n.startswith(first)] == [
        f"{first}.index.deleted", f"{first}.log.deleted", f"{first}.timeindex.deleted"]
    wait_until(lambda: not any(n.startswith(first) for n in files(broker, delayed)), timeout=10,
               what="the .deleted files to go")
    assert time.monotonic() - deleted_at > 1.4


@pytest.mark.parametrize("settings", [{}, {"segment.index.bytes": "16"}])
def test_segment_index_bytes_rolls_when_the_index_is_full(broker_factory, topic_name, settings):
    """An offset index of 16 bytes holds two entries (one per batch with index.interval.bytes=0): the segment rolls
    at the third batch."""
    broker = broker_factory()
    create_topic(broker.bootstrap, topic_name, config={"index.interval.bytes": "0", **settings})
    with Wire(broker.bootstrap) as w:
        for _ in range(5):
            assert produce_raw(w, topic_name, 0, one()).error_code == NONE
    logs = [n for n in files(broker, topic_name) if n.endswith(".log")]
    assert len(logs) == (1 if not settings else 3)


@pytest.mark.parametrize(("interval", "entries"), [(4096, 0), (0, 4)])
def test_index_interval_bytes_spaces_offset_index_entries(broker_factory, topic_name, interval, entries):
    """An entry once more than index.interval.bytes were appended since the last one, as Kafka: with 0, one for
    every batch after the first; with 4096, none for five small batches."""
    broker = broker_factory()
    create_topic(broker.bootstrap, topic_name, config={"index.interval.bytes": str(interval)})
    with Wire(broker.bootstrap) as w:
        for _ in range(5):
            assert produce_raw(w, topic_name, 0, one()).error_code == NONE
    broker.stop()  # a clean stop trims the index file to its entries
    assert (broker.data_dir / f"{topic_name}-0" / "00000000000000000000.index").stat().st_size == 8 * entries


def test_refused_broker_key_stops_the_start(tmp_path):
    from oncelog.embedded import BrokerProcess

    broker = BrokerProcess(tmp_path / "data", {"log.flush.start.offset.checkpoint.interval.ms": 1000})
    with pytest.raises(RuntimeError, match=r"exited during startup \(code 2\)"):
        broker.start(timeout=30)
    assert ("configuration error: Configuration log.flush.start.offset.checkpoint.interval.ms is not supported: "
            "log-start-offset-checkpoint is written every time a log start offset moves") in broker.log_tail()


def test_group_keys_on_the_wire(broker_factory, topic_name):
    """group.max.size, offset.metadata.max.bytes and group.min.session.timeout.ms, each against its default."""
    from kafka.protocol.consumer import OffsetCommitRequest
    from tests.integration.test_groups_wire import join, joined_member

    from oncelog.errors import ErrorCode as E

    def commit_with_metadata(w: Wire, metadata: str) -> int:
        T = OffsetCommitRequest.OffsetCommitRequestTopic
        resp = w.request(OffsetCommitRequest(
            group_id="simple", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            retention_time_ms=-1, topics=[T(name=topic_name, partitions=[T.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata=metadata)])]), 7)
        return resp.topics[0].partitions[0].error_code

    base = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 1}
    default = broker_factory(base, name="default")
    tuned = broker_factory({**base, "group.max.size": 1, "offset.metadata.max.bytes": 10,
                            "group.min.session.timeout.ms": 500}, name="tuned")
    for broker in (default, tuned):
        create_topic(broker.bootstrap, topic_name)
    results = {}
    for name, broker in (("default", default), ("tuned", tuned)):
        with Wire(broker.bootstrap) as w, Wire(broker.bootstrap) as other:
            joined_member(w, "full", session=6000)
            second = join(other, "full", session=6000).error_code
            short_session = join(other, "short", session=1000).error_code
            results[name] = (second, commit_with_metadata(w, "x" * 11), short_session)
    assert results == {
        "default": (E.MEMBER_ID_REQUIRED, E.NONE, E.INVALID_SESSION_TIMEOUT),
        "tuned": (E.GROUP_MAX_SIZE_REACHED, E.OFFSET_METADATA_TOO_LARGE, E.MEMBER_ID_REQUIRED),
    }


@pytest.mark.slow
def test_offsets_retention_minutes_and_check_interval(broker_factory, topic_name):
    """A standalone group's committed offset is gone a minute after its commit when expiry runs every 500 ms;
    with the default check interval (10 minutes) the same minute-old offset is still there."""
    from tests.integration.test_groups_wire import commit, fetch

    base = {"offsets.topic.num.partitions": 1, "offsets.retention.minutes": 1}
    checked = broker_factory({**base, "offsets.retention.check.interval.ms": 500}, name="checked")
    unchecked = broker_factory(base, name="unchecked")
    for broker in (checked, unchecked):
        create_topic(broker.bootstrap, topic_name)
        with Wire(broker.bootstrap) as w:
            assert commit(w, "standalone", -1, "", topic_name, {0: 5}) == {0: NONE}
    time.sleep(62)
    with Wire(checked.bootstrap) as a, Wire(unchecked.bootstrap) as b:
        assert fetch(a, "standalone", topic_name, [0]) == {0: (-1, NONE)}
        assert fetch(b, "standalone", topic_name, [0]) == {0: (5, NONE)}


def test_refused_broker_key_on_incremental_alter_configs(module_broker):
    """INVALID_CONFIG naming the key and why, not the 'static: restart with it' answer other broker keys get."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    from tests.integration.helpers import admin

    client = admin(module_broker.bootstrap)
    resource = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[ConfigEntry(
        "log.flush.start.offset.checkpoint.interval.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    (future,) = client.incremental_alter_configs([resource]).values()
    with pytest.raises(KafkaException) as failure:
        future.result(timeout=15)
    error = failure.value.args[0]
    assert error.code() == 40  # INVALID_CONFIG
    assert error.str().startswith("Configuration log.flush.start.offset.checkpoint.interval.ms is not supported: ")
