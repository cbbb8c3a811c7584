"""Idempotent producers on the broker (DESIGN §3, issue 3) with hand-built Produce requests over TCP.

Every rule is checked with its exact error code, the base offset of the answer (a duplicate gets the
ORIGINAL base offset), the high watermark (nothing appended by a refused or duplicate batch) and the log
contents; UNKNOWN_PRODUCER_ID carries the partition's log start offset. Duplicate detection must be as
good after a SIGKILL or a clean restart as before it; the state must survive DeleteRecords past all of a
producer's data (KIP-360) and expire only after `producer.id.expiration.ms` of idleness.
InitProducerId hands out ids that are never reused; DescribeProducers shows the state.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka.protocol.admin import DeleteRecordsRequest, DescribeProducersRequest
from kafka.protocol.producer import InitProducerIdRequest
from tests.integration.helpers import (
    Wire,
    create_topic,
    fetch_raw,
    list_offset_raw,
    metric,
    produce_raw,
    scrape,
    wait_until,
)

from oncelog.records.batch import rewrite_crc
from oncelog.records.builder import build_batch
from oncelog.records.reader import read_batches
from oncelog.storage.producer_state import CachedBatch, ProducerEntry, encode_snapshot

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUEST = 42
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
UNKNOWN_PRODUCER_ID = 59
INVALID_RECORD = 87
EARLIEST, LATEST = -2, -1
MAX_SEQ = 2**31 - 1

PRODUCE_VERSIONS = [7, 9, 11]  # v7: before flexible versions and KIP-467; v9: flexible; v11: the newest served


# -- helpers ----------------------------------------------------------------------------------------------------


def now_ms() -> int:
    return int(time.time() * 1000)


def init_pid(w: Wire, version: int = 2) -> tuple[int, int]:
    kwargs: dict[str, Any] = dict(transactional_id=None, transaction_timeout_ms=60000)
    if version >= 3:
        kwargs.update(producer_id=-1, producer_epoch=-1)
    resp = w.request(InitProducerIdRequest[version](**kwargs), version)
    assert resp.error_code == NONE, resp
    return resp.producer_id, resp.producer_epoch


def idem(pid: int, epoch: int, seq: int, count: int, tag: str, ts: int | None = None) -> bytearray:
    """A batch whose record values name it: `tag`-0, `tag`-1, ..."""
    ts = now_ms() if ts is None else ts
    return build_batch([(None, f"{tag}-{i}".encode(), (), ts) for i in range(count)],
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def plain(tag: str, count: int = 1) -> bytearray:
    return build_batch([(None, f"{tag}-{i}".encode(), (), now_ms()) for i in range(count)])


def send(w: Wire, topic: str, batch: bytearray, version: int = 9, partition: int = 0, acks: int = -1) -> Any:
    return produce_raw(w, topic, partition, batch, version=version, acks=acks)


def accepted(w: Wire, topic: str, batch: bytearray, version: int = 9, partition: int = 0) -> int:
    part = send(w, topic, batch, version, partition)
    assert part.error_code == NONE, part
    return part.base_offset


def hwm(w: Wire, topic: str, partition: int = 0) -> int:
    code, offset, _ = list_offset_raw(w, topic, partition, LATEST)
    assert code == NONE
    return offset


def log_start(w: Wire, topic: str, partition: int = 0) -> int:
    code, offset, _ = list_offset_raw(w, topic, partition, EARLIEST)
    assert code == NONE
    return offset


def log_values(w: Wire, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """Every (offset, value) from the log start to the high watermark, by Fetch."""
    out: list[tuple[int, bytes]] = []
    offset = log_start(w, topic, partition)
    end = hwm(w, topic, partition)
    while offset < end:
        part = fetch_raw(w, topic, partition, offset)
        assert part.error_code == NONE, part
        batches = read_batches(part.records or b"")
        assert batches, f"no progress at {offset}"
        for batch in batches:
            out += [(r.offset, r.value) for r in batch.records if r.offset >= offset]
        offset = batches[-1].next_offset
    return out


def delete_records(w: Wire, topic: str, offset: int, partition: int = 0) -> int:
    req = DeleteRecordsRequest[2]
    t = req.DeleteRecordsTopic
    resp = w.request(req(topics=[t(name=topic, partitions=[t.DeleteRecordsPartition(
        partition_index=partition, offset=offset)])], timeout_ms=10000), 2)
    (p,) = resp.topics[0].partitions
    assert p.error_code == NONE, p
    return p.low_watermark


def describe(w: Wire, topic: str, partitions: list[int]) -> dict[int, Any]:
    req = DescribeProducersRequest[0]
    resp = w.request(req(topics=[req.TopicRequest(name=topic, partition_indexes=partitions)]), 0)
    (t,) = resp.topics
    assert t.name == topic
    return {p.partition_index: p for p in t.partitions}


def producers_of(w: Wire, topic: str, partition: int = 0) -> dict[int, Any]:
    p = describe(w, topic, [partition])[partition]
    assert p.error_code == NONE
    return {s.producer_id: s for s in p.active_producers}


def write_batches(w: Wire, topic: str, pid: int, count: int, version: int = 9, epoch: int = 0,
                  seq: int = 0, tag: str = "b") -> list[tuple[int, int, int, bytearray]]:
    """`count` idempotent batches (1-3 records), each after a plain batch so offsets differ from sequences.

    Returns (first seq, record count, base offset, the batch bytes as sent) per batch."""
    sent = []
    for i in range(count):
        accepted(w, topic, plain(f"{tag}-plain{i}"), version)
        n = 1 + i % 3
        batch = idem(pid, epoch, seq, n, f"{tag}{i}")
        base = accepted(w, topic, bytearray(batch), version)
        sent.append((seq, n, base, batch))
        seq += n
    return sent


def assert_duplicates(w: Wire, topic: str, sent: list, version: int = 9) -> None:
    """Each of the last 5 batches → NONE with its original base offset; the 6th-oldest → 46; nothing appended."""
    end = hwm(w, topic)
    before = log_values(w, topic)
    for seq, n, base, batch in reversed(sent[-5:]):
        part = send(w, topic, bytearray(batch), version)
        assert (part.error_code, part.base_offset) == (NONE, base), (seq, n, part)
    seq, n, base, batch = sent[-6]
    part = send(w, topic, bytearray(batch), version)
    assert (part.error_code, part.base_offset) == (DUPLICATE_SEQUENCE_NUMBER, -1), part
    assert hwm(w, topic) == end
    assert log_values(w, topic) == before


# -- the rules, one broker for all ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, *PRODUCE_VERSIONS])
def test_unknown_producer(module_broker, topic_name, version):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        pid, epoch = init_pid(w)
        for i in range(3):
            accepted(w, topic_name, plain(f"p{i}"), version)
        assert delete_records(w, topic_name, 2) == 2
        for seq in (1, 5, MAX_SEQ):
            part = send(w, topic_name, idem(pid, epoch, seq, 2, "unknown"), version)
            assert (part.error_code, part.base_offset) == (UNKNOWN_PRODUCER_ID, -1), part
            if version >= 5:
                assert part.log_start_offset == 2, "UNKNOWN_PRODUCER_ID must carry the log start offset"
            if version >= 8:
                assert part.error_message and str(seq) in part.error_message
        assert hwm(w, topic_name) == 3
        assert producers_of(w, topic_name) == {}
        # sequence 0 starts the producer's state, at any epoch
        assert accepted(w, topic_name, idem(pid, 4, 0, 2, "first"), version) == 3
        assert accepted(w, topic_name, idem(pid, 4, 2, 1, "second"), version) == 5
        assert [v for _, v in log_values(w, topic_name)] == [b"p2-0", b"first-0", b"first-1", b"second-0"]


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_sequence_and_epoch_rules(module_broker, topic_name, version):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        pid, _ = init_pid(w)
        other, _ = init_pid(w)
        sent = write_batches(w, topic_name, pid, 6, version)  # sequences 0 | 1-2 | 3-5 | 6 | 7-8 | 9-11
        assert [s for s, *_ in sent] == [0, 1, 3, 6, 7, 9]
        accepted(w, topic_name, idem(other, 0, 0, 2, "other"), version)  # another producer in between
        end = hwm(w, topic_name)
        assert end == 6 + 12 + 2
        before = log_values(w, topic_name)

        # rule 1: an exact duplicate of each of the last 5 batches → NONE with the original offset
        for _, _, base, batch in sent[1:]:
            part = send(w, topic_name, bytearray(batch), version)
            assert (part.error_code, part.base_offset, part.log_start_offset) == (NONE, base, 0), part
        # rule 3: older but inside the window → DUPLICATE_SEQUENCE_NUMBER, as are sub-ranges of written data
        for seq, n in [(0, 1), (4, 2), (2, 3), (11, 1)]:
            part = send(w, topic_name, idem(pid, 0, seq, n, "dup"), version)
            assert (part.error_code, part.base_offset) == (DUPLICATE_SEQUENCE_NUMBER, -1), (seq, n, part)
        # rule 4: a gap, or a batch running past the last sequence → OUT_OF_ORDER_SEQUENCE_NUMBER
        for seq, n in [(13, 1), (20, 3), (11, 2), (10, 5)]:
            part = send(w, topic_name, idem(pid, 0, seq, n, "ooo"), version)
            assert (part.error_code, part.base_offset) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1), (seq, n, part)
            if version >= 8:
                assert part.error_message
        # rule 4: a higher epoch must start at sequence 0
        for seq in (12, 1):
            part = send(w, topic_name, idem(pid, 1, seq, 1, "bump"), version)
            assert (part.error_code, part.base_offset) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1), part
        assert hwm(w, topic_name) == end
        assert log_values(w, topic_name) == before

        assert accepted(w, topic_name, idem(pid, 1, 0, 2, "e1"), version) == end
        part = send(w, topic_name, idem(pid, 1, 0, 2, "e1"), version)
        assert (part.error_code, part.base_offset) == (NONE, end)
        # rule 2: the old epoch is fenced now, also for what used to be cached duplicates
        for *_, batch in sent[-2:]:
            part = send(w, topic_name, bytearray(batch), version)
            assert (part.error_code, part.base_offset) == (INVALID_PRODUCER_EPOCH, -1), part
        part = send(w, topic_name, idem(pid, 0, 12, 1, "old"), version)
        assert (part.error_code, part.base_offset) == (INVALID_PRODUCER_EPOCH, -1), part
        # the other producer was not affected by any of this
        part = send(w, topic_name, idem(other, 0, 0, 2, "other"), version)
        assert (part.error_code, part.base_offset) == (NONE, end - 2)
        assert accepted(w, topic_name, idem(other, 0, 2, 1, "other2"), version) == end + 2
        assert accepted(w, topic_name, idem(pid, 1, 2, 1, "e1b"), version) == end + 3

        values = [v for _, v in log_values(w, topic_name)]
        assert values == [v for _, v in before] + [b"e1-0", b"e1-1", b"other2-0", b"e1b-0"]
        assert len(set(values)) == len(values)


def test_duplicate_with_acks_1_and_batch_without_sequence(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        pid, _ = init_pid(w)
        batch = idem(pid, 0, 0, 3, "a")
        assert send(w, topic_name, bytearray(batch), acks=1).base_offset == 0
        part = send(w, topic_name, bytearray(batch), acks=1)
        assert (part.error_code, part.base_offset) == (NONE, 0)
        # a producer id without a base sequence is a malformed batch (Kafka: INVALID_RECORD), not a new producer
        bad = idem(pid, 0, 3, 1, "bad")
        bad[53:57] = (-1).to_bytes(4, "big", signed=True)  # base sequence
        rewrite_crc(bad, 0, len(bad))
        part = send(w, topic_name, bad)
        assert part.error_code == INVALID_RECORD, part
        # acks=1 answers before the fsync: the high watermark (the durable end) catches up shortly after
        wait_until(lambda: hwm(w, topic_name) >= 3, timeout=10, what="the high watermark")
        assert hwm(w, topic_name) == 3
        assert [v for _, v in log_values(w, topic_name)] == [b"a-0", b"a-1", b"a-2"]


def test_describe_producers(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 3)
    with Wire(bs) as w:
        a, _ = init_pid(w)
        b, _ = init_pid(w)
        accepted(w, topic_name, idem(a, 0, 0, 3, "a", ts=1_700_000_000_000))
        accepted(w, topic_name, idem(a, 0, 3, 2, "a", ts=1_700_000_000_500))
        accepted(w, topic_name, idem(b, 0, 0, 1, "b", ts=1_700_000_000_100))
        accepted(w, topic_name, idem(b, 2, 0, 4, "b", ts=1_700_000_000_200))  # epoch bump
        accepted(w, topic_name, idem(a, 0, 0, 7, "a1", ts=1_700_000_000_300), partition=1)
        accepted(w, topic_name, plain("x"), partition=2)
        parts = describe(w, topic_name, [0, 1, 2, 7])
        assert sorted(parts) == [0, 1, 2, 7]
        assert parts[7].error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert parts[2].error_code == NONE and parts[2].active_producers == []
        got = {
            p: sorted((s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp, s.coordinator_epoch,
                       s.current_txn_start_offset) for s in parts[p].active_producers)
            for p in (0, 1)
        }
        # last timestamp: the largest record timestamp of the producer's last batch
        assert got[0] == sorted([(a, 0, 4, 1_700_000_000_500, -1, -1), (b, 2, 3, 1_700_000_000_200, -1, -1)])
        assert got[1] == [(a, 0, 6, 1_700_000_000_300, -1, -1)]
        unknown = describe(w, f"{topic_name}-missing", [0])[0]
        assert unknown.error_code == UNKNOWN_TOPIC_OR_PARTITION


# -- restarts -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("segment_bytes", [None, 600], ids=["replay", "snapshot-at-roll"])
@pytest.mark.parametrize("clean", [False, True], ids=["sigkill", "clean"])
def test_duplicates_survive_restart(broker_factory, topic_name, clean, segment_bytes):
    settings = {} if segment_bytes is None else {"log.segment.bytes": segment_bytes}
    broker = broker_factory(settings, metrics=True)
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        pid, _ = init_pid(w)
        sent = write_batches(w, topic_name, pid, 8)
        assert_duplicates(w, topic_name, sent)
        end = hwm(w, topic_name)
        before = log_values(w, topic_name)
    if segment_bytes:
        assert len(list((broker.data_dir / f"{topic_name}-0").glob("*.log"))) > 2
    broker.restart(clean=clean)
    with Wire(bs) as w:
        assert hwm(w, topic_name) == end
        assert log_values(w, topic_name) == before
        assert_duplicates(w, topic_name, sent)
        samples = scrape(broker.metrics_port)
        assert metric(samples, "oncelog_producer_state_verdicts_total", rule="duplicates_cached") == 5
        assert metric(samples, "oncelog_producer_state_verdicts_total", rule="duplicates_window") == 1
        seq, n, *_ = sent[-1]
        part = send(w, topic_name, idem(pid, 0, seq + n + 1, 1, "gap"))
        assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert accepted(w, topic_name, idem(pid, 0, seq + n, 2, "next")) == end
        state = producers_of(w, topic_name)[pid]
        assert (state.producer_epoch, state.last_sequence) == (0, seq + n + 1)
    # and once more: the state written after the restart survives the next one
    broker.restart(clean=clean)
    with Wire(bs) as w:
        part = send(w, topic_name, idem(pid, 0, seq + n, 2, "next"))
        assert (part.error_code, part.base_offset) == (NONE, end)
        for _, _, base, batch in sent[-4:]:
            part = send(w, topic_name, bytearray(batch))
            assert (part.error_code, part.base_offset) == (NONE, base)
        assert hwm(w, topic_name) == end + 2


@pytest.mark.parametrize("damage", ["flip-newest", "truncate-newest", "remove-all"])
def test_damaged_snapshots_at_restart(broker_factory, topic_name, damage):
    """A corrupt newest snapshot falls back to an older one plus replay; no snapshot at all means a full
    replay. Either way duplicate detection is as good as before the restart."""
    broker = broker_factory({"log.segment.bytes": 600})
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        pid, _ = init_pid(w)
        sent = write_batches(w, topic_name, pid, 10)
        end = hwm(w, topic_name)
    broker.stop()
    snapshots = sorted((broker.data_dir / f"{topic_name}-0").glob("*.snapshot"))
    assert len(snapshots) >= 2 and snapshots[-1].name == f"{end:020d}.snapshot", snapshots
    if damage == "flip-newest":
        data = bytearray(snapshots[-1].read_bytes())
        data[-2] ^= 0x01
        snapshots[-1].write_bytes(bytes(data))
    elif damage == "truncate-newest":
        snapshots[-1].write_bytes(snapshots[-1].read_bytes()[:3])
    else:
        for path in snapshots:
            path.unlink()
    broker.start()
    with Wire(bs) as w:
        assert hwm(w, topic_name) == end
        assert_duplicates(w, topic_name, sent)
        seq, n, *_ = sent[-1]
        assert accepted(w, topic_name, idem(pid, 0, seq + n, 1, "next")) == end
    assert "Traceback" not in broker.log_tail(1000)


def test_sequence_wrap(broker_factory, topic_name):
    """Sequences wrap from 2^31-1 to 0. No client can get there in a test, so the producer state is set up by
    rewriting the snapshot a clean shutdown left (same offsets, sequences just below the wrap)."""
    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        a, _ = init_pid(w)
        b, _ = init_pid(w)
        sent_a = write_batches(w, topic_name, a, 6, tag="a")  # 12 records
        sent_b = write_batches(w, topic_name, b, 1, tag="b")  # 1 record
        end = hwm(w, topic_name)
    broker.stop()
    snapshot = broker.data_dir / f"{topic_name}-0" / f"{end:020d}.snapshot"
    assert snapshot.exists(), "a clean shutdown writes a snapshot at the log end"
    # producer a: its 12 records were sequences MAX_SEQ-12 .. MAX_SEQ-1; producer b's record was MAX_SEQ
    shift = MAX_SEQ - 12
    now = now_ms()
    batches_a = [CachedBatch(s + shift, s + n - 1 + shift, base, base + n - 1, now) for s, n, base, _ in sent_a[1:]]
    entry_a = ProducerEntry(a, 0, -1, now, now, -1)
    entry_a.batches.extend(batches_a)
    (s, n, base, _), = sent_b
    entry_b = ProducerEntry(b, 0, -1, now, now, -1)
    entry_b.batches.append(CachedBatch(MAX_SEQ, MAX_SEQ, base, base, now))
    snapshot.write_bytes(encode_snapshot([entry_a, entry_b]))
    broker.start()
    with Wire(bs) as w:
        assert producers_of(w, topic_name)[a].last_sequence == MAX_SEQ - 1
        # b: the last sequence was 2^31-1, the next is 0
        part = send(w, topic_name, idem(b, 0, 1, 1, "b-gap"))
        assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert accepted(w, topic_name, idem(b, 0, 0, 2, "b-wrapped")) == end
        part = send(w, topic_name, idem(b, 0, MAX_SEQ, 1, "b-dup"))
        assert (part.error_code, part.base_offset) == (NONE, sent_b[0][2])
        part = send(w, topic_name, idem(b, 0, 0, 2, "b-wrapped"))
        assert (part.error_code, part.base_offset) == (NONE, end)
        # a: one batch across the wrap (MAX_SEQ, 0, 1), then on from 2
        across = idem(a, 0, MAX_SEQ, 3, "a-across")
        assert accepted(w, topic_name, bytearray(across)) == end + 2
        assert accepted(w, topic_name, idem(a, 0, 2, 2, "a-after")) == end + 5
        part = send(w, topic_name, bytearray(across))
        assert (part.error_code, part.base_offset) == (NONE, end + 2)
        for s, n, base, _ in sent_a[-3:]:  # still cached, from before the wrap
            part = send(w, topic_name, idem(a, 0, s + shift, n, "a-dup"))
            assert (part.error_code, part.base_offset) == (NONE, base), part
        part = send(w, topic_name, idem(a, 0, sent_a[1][0] + shift, sent_a[1][1], "a-old"))
        assert (part.error_code, part.base_offset) == (DUPLICATE_SEQUENCE_NUMBER, -1)
        part = send(w, topic_name, idem(a, 0, MAX_SEQ - 2000, 1, "a-ancient"))
        assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert hwm(w, topic_name) == end + 7
        state = producers_of(w, topic_name)
        assert (state[a].last_sequence, state[b].last_sequence) == (3, 1)


@pytest.mark.parametrize("restart", ["none", "sigkill", "clean"])
def test_state_outlives_deleted_records(broker_factory, topic_name, restart):
    """KIP-360: DeleteRecords past all of a producer's data; its next batch (next sequence) is accepted."""
    broker = broker_factory({"log.segment.bytes": 600})
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        pid, _ = init_pid(w)
        sent = write_batches(w, topic_name, pid, 7)
        accepted(w, topic_name, plain("tail"))
        end = hwm(w, topic_name)
        assert delete_records(w, topic_name, end) == end
        assert log_start(w, topic_name) == end
        assert pid in producers_of(w, topic_name)
    if restart != "none":
        broker.restart(clean=restart == "clean")
    with Wire(bs) as w:
        assert (log_start(w, topic_name), hwm(w, topic_name)) == (end, end)
        assert pid in producers_of(w, topic_name), "the producer's state must outlive its data"
        # a retry of the last batches is still recognised, with offsets below the log start
        for _, _, base, batch in sent[-5:]:
            part = send(w, topic_name, bytearray(batch))
            assert (part.error_code, part.base_offset, part.log_start_offset) == (NONE, base, end), part
        seq, n, *_ = sent[-1]
        part = send(w, topic_name, idem(pid, 0, seq + n, 2, "after"))
        assert (part.error_code, part.base_offset, part.log_start_offset) == (NONE, end, end), part
        assert log_values(w, topic_name) == [(end, b"after-0"), (end + 1, b"after-1")]
        # delete that too, restart once more: still known
        assert delete_records(w, topic_name, end + 2) == end + 2
    if restart != "none":
        broker.restart(clean=restart == "clean")
    with Wire(bs) as w:
        assert accepted(w, topic_name, idem(pid, 0, seq + n + 2, 1, "again")) == end + 2


def test_idle_producer_keeps_its_sequence_until_forgotten(broker_factory, topic_name):
    """After producer.id.expiration.ms of idleness only the cached batches go: the producer continues at its next
    sequence, and a retry of its last batch is a window duplicate (46), not an unknown producer."""
    broker = broker_factory({"producer.id.expiration.ms": 1000, "producer.id.expiration.check.interval.ms": 300},
                            metrics=True)
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        pid, _ = init_pid(w)
        write_batches(w, topic_name, pid, 3, tag="before")  # sequences 0, 1-2, 3-5
        end = hwm(w, topic_name)
        deadline = time.monotonic() + 10
        while metric(scrape(broker.metrics_port), "oncelog_producer_state_verdicts_total", rule="cache_expired") < 1:
            assert time.monotonic() < deadline, "the idle producer's cached batches never expired"
            time.sleep(0.2)
        assert pid in producers_of(w, topic_name)
        part = send(w, topic_name, idem(pid, 0, 3, 3, "retry"))
        assert (part.error_code, part.base_offset) == (DUPLICATE_SEQUENCE_NUMBER, -1), part
        assert hwm(w, topic_name) == end
        assert accepted(w, topic_name, idem(pid, 0, 6, 1, "next")) == end


def test_expiry(broker_factory, topic_name):
    broker = broker_factory({"producer.id.expiration.ms": 2000, "producer.id.expiration.check.interval.ms": 500,
                             "transactional.id.expiration.ms": 2000}, metrics=True)
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        idle, _ = init_pid(w)
        busy, _ = init_pid(w)
        sent = write_batches(w, topic_name, idle, 3, tag="idle")  # sequences 0, 1-2, 3-5
        assert delete_records(w, topic_name, 1) == 1
        busy_seq = 0
        start = time.monotonic()
        # the busy producer writes every 300 ms; the idle one goes away
        while idle in producers_of(w, topic_name):
            assert time.monotonic() - start < 10, "idle producer state never expired"
            accepted(w, topic_name, idem(busy, 0, busy_seq, 1, "busy"))
            busy_seq += 1
            time.sleep(0.3)
        assert time.monotonic() - start >= 1.8, "expired before producer.id.expiration.ms of idleness"
        assert busy in producers_of(w, topic_name), "an active producer must not expire"
        end = hwm(w, topic_name)
        for seq, n in [(6, 1), (3, 3)]:  # its next batch, and a retry of its last one
            part = send(w, topic_name, idem(idle, 0, seq, n, "late"))
            assert (part.error_code, part.base_offset, part.log_start_offset) == (UNKNOWN_PRODUCER_ID, -1, 1), part
        assert hwm(w, topic_name) == end
        samples = scrape(broker.metrics_port)
        assert metric(samples, "oncelog_producer_state_verdicts_total", rule="unknown_producer") == 2
        assert metric(samples, "oncelog_producer_ids", topic=topic_name, partition="0") == 1
        # sequence 0 starts over (what a client does after bumping its epoch); the busy one goes on
        assert accepted(w, topic_name, idem(idle, 1, 0, 2, "restart")) == end
        assert accepted(w, topic_name, idem(idle, 1, 2, 1, "restart2")) == end + 2
        assert accepted(w, topic_name, idem(busy, 0, busy_seq, 1, "busy")) == end + 3
        assert len(sent) == 3


# -- InitProducerId ----------------------------------------------------------------------------------------------


def test_init_producer_id_never_reuses_ids(broker_factory):
    broker = broker_factory()
    bs = broker.bootstrap
    seen: list[int] = []

    def take(w: Wire) -> None:
        for version in range(6):
            pid, epoch = init_pid(w, version)
            assert epoch == 0
            seen.append(pid)

    with Wire(bs) as w:
        take(w)
        # v3+: a producer id without an epoch (or the reverse) is an invalid request
        for pid, epoch in [(seen[0], -1), (-1, 0)]:
            resp = w.request(InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60000,
                                                      producer_id=pid, producer_epoch=epoch), 4)
            assert (resp.error_code, resp.producer_id) == (INVALID_REQUEST, -1)
        # an idempotent producer asking with its id and epoch (kafka-python's epoch bump) gets a fresh id
        resp = w.request(InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60000,
                                                  producer_id=seen[-1], producer_epoch=0), 4)
        assert resp.error_code == NONE and resp.producer_id > seen[-1]
        seen.append(resp.producer_id)
    for clean in (False, False, True, False):
        broker.restart(clean=clean)
        with Wire(bs) as w:
            take(w)
    assert seen == sorted(seen) and len(set(seen)) == len(seen), seen
