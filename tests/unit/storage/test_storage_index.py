"""Offset and time indexes: Kafka's byte format, lookups, load and sanity checks."""

from __future__ import annotations

import struct

import pytest

from oncelog.storage.index import OffsetIndex, TimeIndex


def test_offset_index_file_is_kafka_format(tmp_path):
    path = str(tmp_path / "00000000000000000100.index")
    index = OffsetIndex(path, 100, 1024)
    index.create_file()
    index.append(105, 0)
    index.write_pending()
    index.append(110, 4200)
    index.append(130, 9000)
    index.write_pending()
    index.close()
    data = (tmp_path / "00000000000000000100.index").read_bytes()
    assert data == struct.pack(">iiiiii", 5, 0, 10, 4200, 30, 9000)

    loaded = OffsetIndex.load(path, 100, 1024)
    assert loaded.entries() == [(105, 0), (110, 4200), (130, 9000)]
    assert loaded.problem(10000, full=True) is None


def test_offset_index_lookup_is_floor(tmp_path):
    index = OffsetIndex(str(tmp_path / "x.index"), 100, 1024)
    for offset, position in [(105, 100), (110, 4200), (130, 9000)]:
        index.append(offset, position)
    assert index.lookup(50) == (100, 0)
    assert index.lookup(104) == (100, 0)
    assert index.lookup(105) == (105, 100)
    assert index.lookup(129) == (110, 4200)
    assert index.lookup(10**9) == (130, 9000)
    with pytest.raises(ValueError):
        index.append(130, 9500)


def test_offset_index_full_and_truncate(tmp_path):
    index = OffsetIndex(str(tmp_path / "x.index"), 0, 16)  # two entries
    assert index.append(1, 10) and index.append(2, 20)
    assert index.is_full and not index.append(3, 30)
    index.truncate_from_position(20)
    assert index.entries() == [(1, 10)] and not index.is_full


def test_offset_index_sanity(tmp_path):
    path = tmp_path / "x.index"
    path.write_bytes(struct.pack(">iiii", 5, 100, 3, 200))  # offsets go backwards
    index = OffsetIndex.load(str(path), 0, 1024)
    assert "does not follow" in index.problem(1000, full=True)
    path.write_bytes(struct.pack(">ii", 5, 100) + b"\0\0\0")  # torn entry
    assert "multiple" in OffsetIndex.load(str(path), 0, 1024).problem(1000, full=False)
    path.write_bytes(struct.pack(">ii", 5, 5000))
    assert "beyond" in OffsetIndex.load(str(path), 0, 1024).problem(1000, full=False)
    path.write_bytes(struct.pack(">iiii", 5, 100, 0, 0))  # zero-filled tail after a crash
    assert OffsetIndex.load(str(path), 0, 1024).problem(1000, full=False) is not None


def test_time_index_only_grows(tmp_path):
    path = str(tmp_path / "00000000000000000010.timeindex")
    index = TimeIndex(path, 10, 1200)
    index.create_file()
    assert index.maybe_append(1000, 12)
    assert not index.maybe_append(1000, 15)  # not greater
    assert not index.maybe_append(900, 16)
    assert not index.maybe_append(-1, 17)
    assert index.maybe_append(2000, 20)
    index.write_pending()
    index.close()
    assert (tmp_path / "00000000000000000010.timeindex").read_bytes() == struct.pack(">qiqi", 1000, 2, 2000, 10)
    loaded = TimeIndex.load(path, 10, 1200)
    assert loaded.entries() == [(1000, 12), (2000, 20)]
    assert loaded.lookup(999) == (-1, 10)
    assert loaded.lookup(1500) == (1000, 12)
    assert loaded.lookup(2000) == (2000, 20)
    assert loaded.problem(21, full=True) is None
    assert "beyond" in loaded.problem(20, full=True)
    loaded.truncate_from_offset(15)
    assert loaded.entries() == [(1000, 12)]


def test_time_index_full(tmp_path):
    index = TimeIndex(str(tmp_path / "x.timeindex"), 0, 24)  # two entries
    assert index.maybe_append(1, 1) and index.maybe_append(2, 2)
    assert index.is_full and not index.maybe_append(3, 3)
    assert index.maybe_append(3, 3, skip_full_check=True)
