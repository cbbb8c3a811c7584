"""Partition for replication, on real files: truncation rebuilds producer state, the aborted-transaction index and
the leader epochs; starting over; following the leader's log start; a new replica taking over the leader's producer
state (seed 000); the LogManager's checkpointed forms."""

from __future__ import annotations

import os

import pytest
from tests.unit.storage.storage_helpers import abandon

from oncelog.config import load_broker_config
from oncelog.errors import ErrorCode, KafkaError
from oncelog.records.batch import read_header
from oncelog.records.builder import build_batch
from oncelog.storage.checkpoints import LOG_START_OFFSET_FILE, RECOVERY_POINT_FILE, read_checkpoint
from oncelog.storage.leader_epochs import LEADER_EPOCH_CHECKPOINT_FILE
from oncelog.storage.log_manager import LogManager
from oncelog.storage.partition import Partition
from oncelog.storage.txn_index import SUFFIX as TXN_SUFFIX

PID = 4242
TXN_PID = 5151
NOW = 1_000_000


def put(part: Partition, pid: int, seq: int, count: int, tag: str = "v", epoch: int = 0,
        transactional: bool = False, leader_epoch: int = -1):
    buf = build_batch([(None, f"{tag}-{i}".encode(), (), NOW) for i in range(count)], producer_id=pid,
                      producer_epoch=epoch, base_sequence=seq, transactional=transactional,
                      partition_leader_epoch=leader_epoch)
    return part.append_records(buf, read_header(buf), NOW, False, "txn" if transactional else None)


def put_plain(part: Partition, leader_epoch: int = -1) -> None:
    buf = build_batch([(None, b"plain", (), NOW)], partition_leader_epoch=leader_epoch)
    assert part.append_records(buf, read_header(buf), NOW, False).error == ErrorCode.NONE


def fill(part: Partition, batches: int, seq: int = 0) -> list[tuple[int, int, int]]:
    """`batches` idempotent batches of 1-3 records from `seq`, each after a plain batch: (seq, count, offset)."""
    sent = []
    for i in range(batches):
        put_plain(part)
        count = 1 + i % 3
        result = put(part, PID, seq, count, f"s{seq}")
        assert result.error == ErrorCode.NONE and not result.duplicate
        sent.append((seq, count, result.base_offset))
        seq += count
    return sent


def check_duplicates(part: Partition, sent: list[tuple[int, int, int]]) -> None:
    """The last five batches are exact duplicates answered with their offsets, the sixth a window duplicate."""
    leo = part.log.log_end_offset
    for seq, count, base in sent[-5:]:
        result = put(part, PID, seq, count, "resend")
        assert (result.error, result.base_offset, result.duplicate) == (ErrorCode.NONE, base, True)
    seq, count, _ = sent[-6]
    assert put(part, PID, seq, count, "resend").error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    seq, count, _ = sent[-1]
    assert put(part, PID, seq + count + 1, 1, "gap").error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert part.log.log_end_offset == leo


def snapshots(part: Partition) -> list[int]:
    return part.producers.list_snapshots()


def txn_files(part: Partition) -> list[str]:
    return sorted(n for n in os.listdir(part.log.directory) if n.endswith(TXN_SUFFIX))


@pytest.fixture
def partition(open_log):
    def make(**kwargs) -> Partition:
        part = Partition(open_log(**kwargs))
        part.verify_transaction = lambda *args: (ErrorCode.NONE, None)
        part.load_producer_state(NOW)
        return part

    return make


# -- truncate_to ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("segment_bytes", [400, 1 << 20], ids=["rolled", "one-segment"])
def test_truncation_rebuilds_producer_state_for_what_is_left(partition, segment_bytes):
    part = partition(segment_bytes=segment_bytes)
    sent = fill(part, 8)
    part.snapshot()
    sent += fill(part, 6, seq=sent[-1][0] + sent[-1][1])
    cut_seq, cut_count, cut_offset = sent[10]
    assert part.truncate_to(cut_offset - 1, NOW) == cut_offset - 1  # before its plain batch
    assert part.log.log_end_offset == cut_offset - 1
    assert all(offset <= cut_offset - 1 for offset in snapshots(part))
    kept = sent[:10]
    check_duplicates(part, kept)
    # the batches that were cut are new again: the producer's retry lands after the cut
    result = put(part, PID, cut_seq, cut_count, "again")
    assert (result.error, result.base_offset, result.duplicate) == (ErrorCode.NONE, cut_offset - 1, False)


def test_truncation_inside_an_idempotent_batch_removes_all_of_it(partition):
    part = partition()
    sent = fill(part, 7)
    seq, count, offset = sent[5]  # a batch of 3 records
    assert count == 3
    assert part.truncate_to(offset + 1, NOW) == offset
    prev_seq, prev_count, prev_offset = sent[4]
    result = put(part, PID, prev_seq, prev_count, "resend")
    assert (result.error, result.base_offset, result.duplicate) == (ErrorCode.NONE, prev_offset, True)
    result = put(part, PID, seq, count, "again")
    assert (result.error, result.base_offset, result.duplicate) == (ErrorCode.NONE, offset, False)


def test_truncation_survives_a_restart(partition, crash):
    part = partition(segment_bytes=400)
    sent = fill(part, 12)
    part.snapshot()
    end = part.truncate_to(sent[9][2], NOW)
    crash(part.log)
    again = partition(clean=False, segment_bytes=400)
    assert again.log.log_end_offset == end
    check_duplicates(again, sent[:9])


def test_truncation_reopens_a_transaction_whose_abort_was_cut(partition):
    part = partition(segment_bytes=400)
    put_plain(part)
    first = put(part, TXN_PID, 0, 2, "t", transactional=True).base_offset
    put_plain(part)
    abort = part.append_marker(TXN_PID, 0, False, 0, NOW).base_offset
    put_plain(part)
    part.snapshot()
    assert part.aborted_transactions(0, part.log.log_end_offset) == [(TXN_PID, first)]
    assert part.last_stable_offset == part.log.high_watermark
    part.truncate_to(abort, NOW)
    assert part.aborted_transactions(0, part.log.log_end_offset) == []
    assert part.producers.open_transaction(TXN_PID)
    assert part.last_stable_offset == first
    # on disk too: a restart sees the same
    part.close()
    again = partition(segment_bytes=400)
    assert again.aborted_transactions(0, again.log.log_end_offset) == []
    assert again.last_stable_offset == first
    # committing it now works as on the leader
    assert again.append_marker(TXN_PID, 0, True, 0, NOW).error == ErrorCode.NONE
    assert again.aborted_transactions(0, again.log.log_end_offset) == []


def test_truncation_drops_the_txn_index_of_deleted_segments(partition):
    part = partition(segment_bytes=400)
    fill(part, 4)
    cut = part.log.log_end_offset
    part.log.roll()
    put(part, TXN_PID, 0, 1, "t", transactional=True)
    part.append_marker(TXN_PID, 0, False, 0, NOW)
    assert txn_files(part) == [f"{cut:020d}{TXN_SUFFIX}"]
    part.truncate_to(cut, NOW)
    assert txn_files(part) == [] and part.aborted_transactions(0, 10**6) == []
    assert not part.producers.open_transaction(TXN_PID)


def test_truncation_cuts_the_leader_epochs(partition):
    part = partition()
    fill(part, 3)
    part.leader_epochs.assign(1, 0)
    part.leader_epochs.assign(2, 4)
    part.leader_epochs.assign(3, part.log.log_end_offset)  # became leader, wrote nothing
    end = part.log.log_end_offset
    assert part.truncate_to(end, NOW) == end  # nothing to cut, but the empty epoch goes, as in Kafka
    assert part.leader_epochs.entries() == [(1, 0), (2, 4)]
    assert part.truncate_to(3, NOW) == 3
    assert part.leader_epochs.entries() == [(1, 0)]


def test_leader_epochs_are_cut_to_the_log_at_load(open_log):
    """A checkpoint written before a crash may name epochs that start past what the log kept."""
    part = Partition(open_log(fsync=False))
    for _ in range(5):
        put_plain(part)
    part.leader_epochs.assign(0, 0)
    part.leader_epochs.assign(4, 3)
    part.leader_epochs.assign(6, 10)
    part.close()
    again = Partition(open_log(fsync=False))
    assert again.leader_epochs.entries() == [(0, 0), (4, 3)]


def test_unreadable_leader_epochs_are_rebuilt_from_the_batches(open_log):
    part = Partition(open_log(fsync=False))
    for epoch in (0, 0, 2, 2, 5):
        put_plain(part, leader_epoch=epoch)
    part.close()
    with open(os.path.join(part.log.directory, LEADER_EPOCH_CHECKPOINT_FILE), "w") as f:
        f.write("garbage\n")
    again = Partition(open_log(fsync=False))
    assert again.leader_epochs.entries() == [(0, 0), (2, 2), (5, 4)]


# -- truncate_fully_and_start_at --------------------------------------------------------------------------
def test_truncate_fully_forgets_everything(partition):
    part = partition(segment_bytes=400)
    fill(part, 8)
    put(part, TXN_PID, 0, 1, "t", transactional=True)
    part.append_marker(TXN_PID, 0, False, 0, NOW)
    part.leader_epochs.assign(1, 0)
    part.snapshot()
    part.truncate_fully_and_start_at(500, NOW)
    assert part.producers.entries == {} and part.last_stable_offset == 500
    assert snapshots(part) == [500] and txn_files(part) == []
    assert part.leader_epochs.entries() == []
    assert put(part, PID, 3, 1).error == ErrorCode.UNKNOWN_PRODUCER_ID
    result = put(part, PID, 0, 1)
    assert (result.error, result.base_offset) == (ErrorCode.NONE, 500)


# -- producer state for a new replica (seed 000) -------------------------------------------------------------
def new_replica(partition, tmp_path, name="replica-0"):
    return partition(directory=tmp_path / name)


@pytest.mark.parametrize("restart", ["none", "clean", "crash"])
def test_a_new_replica_answers_retries_as_the_leader_would(partition, tmp_path, restart):
    leader = partition(segment_bytes=400)
    sent = fill(leader, 9)
    leader.log.delete_records_before(leader.log.high_watermark)  # the producer's data is gone (KIP-360)
    snapshot, offset = leader.export_producer_state()
    assert offset == leader.log.log_end_offset

    replica = new_replica(partition, tmp_path)
    replica.truncate_fully_and_start_at(offset, NOW)
    replica.install_producer_state(snapshot, offset)
    assert offset in snapshots(replica)
    if restart == "clean":
        replica.close()
    elif restart == "crash":
        abandon(replica.log)
    if restart != "none":
        replica = partition(directory=tmp_path / "replica-0", clean=restart == "clean", log_start_offset=offset)
    check_duplicates(replica, sent)
    result = put(replica, PID, sent[-1][0] + sent[-1][1], 1, "next")
    assert (result.error, result.base_offset, result.duplicate) == (ErrorCode.NONE, offset, False)


def test_without_the_transfer_a_new_replica_does_not_know_the_producer(partition, tmp_path):
    leader = partition()
    sent = fill(leader, 6)
    offset = leader.log.log_end_offset
    replica = new_replica(partition, tmp_path)
    replica.truncate_fully_and_start_at(offset, NOW)
    seq, count, _ = sent[-1]
    assert put(replica, PID, seq, count, "resend").error == ErrorCode.UNKNOWN_PRODUCER_ID


def test_an_open_transaction_moves_with_the_producer_state(partition, tmp_path):
    leader = partition()
    put_plain(leader)
    first = put(leader, TXN_PID, 0, 2, "t", transactional=True).base_offset
    snapshot, offset = leader.export_producer_state()
    replica = new_replica(partition, tmp_path)
    replica.truncate_fully_and_start_at(offset, NOW)
    replica.install_producer_state(snapshot, offset)
    assert replica.producers.open_transaction(TXN_PID)
    assert replica.last_stable_offset == first
    assert replica.append_marker(TXN_PID, 0, True, 0, NOW).error == ErrorCode.NONE
    assert replica.last_stable_offset == replica.log.high_watermark


def test_install_needs_a_log_ending_at_the_exported_offset(partition, tmp_path):
    leader = partition()
    fill(leader, 6)
    snapshot, offset = leader.export_producer_state()
    replica = new_replica(partition, tmp_path)
    with pytest.raises(ValueError, match="ends at 0"):
        replica.install_producer_state(snapshot, offset)
    replica.truncate_fully_and_start_at(offset, NOW)
    damaged = bytearray(snapshot)
    damaged[-1] ^= 0xFF
    with pytest.raises(ValueError, match="CRC"):
        replica.install_producer_state(bytes(damaged), offset)
    assert replica.producers.entries == {}


def test_a_log_that_started_over_is_marked_until_a_leaders_state_is_installed(partition, tmp_path):
    """The mark survives a restart: a replica that crashed between starting over and installing knows its
    producer state is not complete (the replica fetcher asks its leader again)."""
    leader = partition()
    fill(leader, 6)
    snapshot, offset = leader.export_producer_state()
    replica = new_replica(partition, tmp_path)
    assert not replica.producer_state_incomplete
    replica.truncate_fully_and_start_at(offset, NOW)
    assert replica.producer_state_incomplete
    replica.close()
    replica = partition(directory=tmp_path / "replica-0", clean=True, log_start_offset=offset)
    assert replica.producer_state_incomplete
    replica.install_producer_state(snapshot, offset)
    assert not replica.producer_state_incomplete
    # A cut below the first segment starts the log over too.
    put(replica, PID + 1, 0, 2)
    replica.truncate_to(offset - 1, NOW)
    assert replica.producer_state_incomplete and replica.log.log_end_offset == offset - 1


# -- advance_log_start -----------------------------------------------------------------------------------
def test_advance_log_start_keeps_producers_and_trims_leader_epochs(partition):
    part = partition(segment_bytes=400, fsync=False)
    sent = fill(part, 8)
    part.leader_epochs.assign(1, 0)
    part.leader_epochs.assign(2, 6)
    end = part.log.log_end_offset
    assert part.advance_log_start(end - 1) == end - 1
    assert part.leader_epochs.entries() == [(2, end - 1)]
    assert part.advance_log_start(3) == end - 1
    check_duplicates(part, sent)


# -- LogManager: the same, checkpointed ----------------------------------------------------------------------
def test_log_manager_checkpoints_truncation_and_log_start(tmp_path, clock):
    config = load_broker_config(overrides=["oncelog.fsync.enable=true"])
    mgr = LogManager(tmp_path / "data", config, now_ms=clock)
    mgr.startup()
    try:
        mgr.create_topic("r", 1)
        part = mgr.get_partition("r", 0)
        fill(part, 6)
        mgr.checkpoint()
        recovery = tmp_path / "data" / RECOVERY_POINT_FILE
        starts = tmp_path / "data" / LOG_START_OFFSET_FILE
        assert mgr.truncate_to("r", 0, 7) == 6
        assert read_checkpoint(recovery)[("r", 0)] == 6
        assert mgr.advance_log_start("r", 0, 4) == 4
        assert read_checkpoint(starts)[("r", 0)] == 4
        mgr.truncate_fully_and_start_at("r", 0, 40)
        assert read_checkpoint(starts)[("r", 0)] == 40 and read_checkpoint(recovery)[("r", 0)] == 40
        with pytest.raises(KafkaError) as info:
            mgr.truncate_to("nope", 0, 1)
        assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    finally:
        mgr.shutdown()
    again = LogManager(tmp_path / "data", config, now_ms=clock)
    again.startup()
    try:
        plog = again.get_log("r", 0)
        assert (plog.log_start_offset, plog.log_end_offset) == (40, 40)
    finally:
        again.shutdown()

