"""A follower's append (Partition.append_replicated), on real files: the leader's batches go in as they are, and the
follower ends with the leader's producer state (cached batches included), aborted transactions and leader epochs,
so after a failover it answers retries exactly as the old leader would (seed 000)."""

from __future__ import annotations

import os

import pytest

from oncelog.errors import ErrorCode, KafkaError
from oncelog.records.batch import LOG_OVERHEAD, read_header
from oncelog.records.builder import build_batch
from oncelog.storage.partition import Partition

PID, TXN_PID = 4242, 5151
NOW = 1_000_000


def client_batch(pid: int, seq: int, count: int, tag: str, transactional: bool = False) -> bytearray:
    return build_batch([(None, f"{tag}-{i}".encode(), (), NOW) for i in range(count)], producer_id=pid,
                       producer_epoch=0, base_sequence=seq, transactional=transactional)


def leader_append(part: Partition, pid: int, seq: int, count: int, tag: str = "v", transactional: bool = False):
    buf = client_batch(pid, seq, count, tag, transactional)
    return part.append_records(buf, read_header(buf), NOW, False, "txn" if transactional else None)


def log_batches(part: Partition, start: int = 0) -> list[bytearray]:
    """Every batch of the log from `start`, as the bytes a fetch would carry."""
    out = []
    plog = part.log
    offset = start
    while offset < plog.log_end_offset:
        result = plog.read(offset, 1 << 20, plog.log_end_offset)
        data = result.data if result.data is not None else os.pread(result.fd, result.length, result.position)
        result.close()
        pos = 0
        while pos + 12 <= len(data):
            header = read_header(data, pos)
            size = header.length + LOG_OVERHEAD
            out.append(bytearray(data[pos:pos + size]))
            pos += size
            offset = header.base_offset + header.last_offset_delta + 1
    return out


def replicate(src: Partition, dst: Partition, start: int = 0) -> None:
    for buf in log_batches(src, start):
        dst.append_replicated(buf, read_header(buf), NOW + 5)


@pytest.fixture
def pair(open_log, tmp_path):
    def make() -> tuple[Partition, Partition]:
        parts = []
        for name in ("leader", "follower"):
            part = Partition(open_log(directory=tmp_path / name))
            part.verify_transaction = lambda *args: (ErrorCode.NONE, None)
            part.load_producer_state(NOW)
            parts.append(part)
        return parts[0], parts[1]

    return make


def test_the_follower_ends_with_the_leaders_state(pair):
    leader, follower = pair()
    leader.leader_epochs.assign(3, 0)
    leader.leader_epoch = 3
    sent = []
    seq = 0
    for i in range(7):
        count = 1 + i % 3
        result = leader_append(leader, PID, seq, count)
        sent.append((seq, count, result.base_offset))
        seq += count
    assert leader_append(leader, TXN_PID, 0, 2, "t", transactional=True).error == ErrorCode.NONE
    assert leader.append_marker(TXN_PID, 0, False, 1, NOW).error == ErrorCode.NONE
    leader.leader_epochs.assign(5, leader.log.log_end_offset)
    leader.leader_epoch = 5
    assert leader_append(leader, PID, seq, 1).error == ErrorCode.NONE
    sent.append((seq, 1, leader.log.log_end_offset - 1))

    replicate(leader, follower)

    assert follower.log.log_end_offset == leader.log.log_end_offset
    assert log_batches(follower) == log_batches(leader)  # byte for byte, leader epochs stamped by the leader
    assert [read_header(b).leader_epoch for b in log_batches(follower)] == [3] * 9 + [5]
    assert follower.leader_epochs.entries() == leader.leader_epochs.entries() == [(3, 0), (5, 16)]
    assert follower.aborted_transactions(0, follower.log.log_end_offset) == \
        leader.aborted_transactions(0, leader.log.log_end_offset) == [(TXN_PID, 13)]
    assert follower.producers.first_unstable_offset() is None
    mine, theirs = follower.producers.entries, leader.producers.entries
    assert set(mine) == set(theirs) == {PID, TXN_PID}
    assert [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in mine[PID].batches] == \
        [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in theirs[PID].batches]

    # The follower becomes leader: exact retries get their original offsets, an older one is a window duplicate.
    follower.leader_epoch = 6
    end = follower.log.log_end_offset
    for seq, count, base in sent[-5:]:
        result = leader_append(follower, PID, seq, count, "retry")
        assert (result.error, result.base_offset, result.duplicate) == (ErrorCode.NONE, base, True)
    seq, count, _ = sent[-6]
    assert leader_append(follower, PID, seq, count, "retry").error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert follower.log.log_end_offset == end
    last_seq, last_count, _ = sent[-1]
    result = leader_append(follower, PID, last_seq + last_count, 1, "next")
    assert (result.error, result.base_offset) == (ErrorCode.NONE, end)
    assert read_header(log_batches(follower, end)[0]).leader_epoch == 6


def test_an_open_transaction_stays_open_on_the_follower(pair):
    leader, follower = pair()
    assert leader_append(leader, TXN_PID, 0, 2, "t", transactional=True).error == ErrorCode.NONE
    replicate(leader, follower)
    assert follower.producers.first_unstable_offset() == 0
    assert leader.append_marker(TXN_PID, 0, True, 1, NOW).error == ErrorCode.NONE
    replicate(leader, follower, start=2)
    assert follower.producers.first_unstable_offset() is None
    assert follower.aborted_transactions(0, 10) == []


def test_a_batch_may_skip_offsets_but_never_start_below_the_log_end(pair):
    """A cleaned leader serves batches with gaps between them (docs/log-cleaner.md §2): the copy keeps the same
    offsets and the same gaps. A batch below the log end is refused: it would overwrite or reorder the log."""
    leader, follower = pair()
    for seq in range(3):
        assert leader_append(leader, PID, seq, 1).error == ErrorCode.NONE
    first, second, third = log_batches(leader)
    follower.append_replicated(first, read_header(first), NOW)
    with pytest.raises(KafkaError) as info:
        follower.append_replicated(first, read_header(first), NOW)  # already there
    assert info.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    follower.append_replicated(third, read_header(third), NOW)  # the second one gone, as a cleaner removes it
    assert follower.log.log_end_offset == 3
    assert [h.base_offset for h in follower.log.iter_batches()] == [0, 2]
    with pytest.raises(KafkaError) as info:
        follower.append_replicated(second, read_header(second), NOW)
    assert info.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert [b.first_offset for b in follower.producers.entries[PID].batches] == [0, 2]


def test_unstamped_batches_leave_the_epoch_cache_alone(pair):
    leader, follower = pair()
    assert leader_append(leader, PID, 0, 1).error == ErrorCode.NONE  # a single node's batch: epoch -1
    replicate(leader, follower)
    assert follower.leader_epochs.entries() == []
