"""Replica logs compared on disk (tests/faults/replicas.py): segment files holding real RecordBatch v2 bytes."""

from __future__ import annotations

from oncelog.records.builder import build_batch
from tests.faults.replicas import batches, divergences


def segment(directory, batches_, name="00000000000000000000.log", tail=b""):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"".join(bytes(b) for b in batches_) + tail)
    return directory


def batch(base, values, epoch=0):
    return build_batch([(None, v, (), 1_700_000_000_000) for v in values], base_offset=base,
                       partition_leader_epoch=epoch)  # fixed timestamps: the same records make the same bytes


def test_identical_replicas_and_a_lagging_or_trimmed_one_do_not_diverge(tmp_path):
    log = [batch(0, [b"a", b"b"]), batch(2, [b"c"]), batch(3, [b"d"], epoch=1)]
    a = segment(tmp_path / "1", log)
    b = segment(tmp_path / "2", log[:2], tail=bytes(log[2])[:20])  # behind, its last batch still being written
    c = segment(tmp_path / "3", log[1:], name="00000000000000000002.log")  # log start moved past offset 0
    assert [(x.base, x.last, x.epoch) for x in batches(a)] == [(0, 1, 0), (2, 2, 0), (3, 3, 1)]
    assert len(batches(b)) == 2
    assert divergences({1: a, 2: b, 3: c, 4: tmp_path / "missing"}) == []


def test_another_batch_at_an_offset_both_hold_is_a_divergence(tmp_path):
    a = segment(tmp_path / "1", [batch(0, [b"a"]), batch(1, [b"b"], epoch=1)])
    b = segment(tmp_path / "2", [batch(0, [b"a"]), batch(1, [b"x"], epoch=2), batch(2, [b"y"], epoch=2)])
    (found,) = divergences({1: a, 2: b})
    assert found["brokers"] == [1, 2] and found["offset"] == 1
    assert found[1]["epoch"] == 1 and found[2]["epoch"] == 2
