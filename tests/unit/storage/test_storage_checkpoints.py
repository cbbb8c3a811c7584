"""Kafka-format checkpoint files."""

from __future__ import annotations

import os

import pytest

from oncelog.storage.checkpoints import CorruptCheckpointError, read_checkpoint, write_checkpoint


def test_round_trip_in_kafka_format(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    offsets = {("orders", 1): 42, ("orders", 0): 7, ("__consumer_offsets", 12): 0}
    write_checkpoint(path, offsets)
    assert path.read_text() == "0\n3\n__consumer_offsets 12 0\norders 0 7\norders 1 42\n"
    assert read_checkpoint(path) == offsets
    assert os.listdir(tmp_path) == ["recovery-point-offset-checkpoint"]  # no temp file left
    write_checkpoint(path, {})
    assert read_checkpoint(path) == {}


def test_missing_file_is_empty(tmp_path):
    assert read_checkpoint(tmp_path / "nope") == {}


@pytest.mark.parametrize(
    "text, where",
    [
        ("", "line 1"),
        ("1\n0\n", "line 1"),
        ("0\nx\n", "line 2"),
        ("0\n2\nt 0 1\n", "line 2"),
        ("0\n1\nt 0\n", "line 3"),
        ("0\n1\nt zero 1\n", "line 3"),
    ],
)
def test_corrupt_file_raises_a_clear_error(tmp_path, text, where):
    path = tmp_path / "log-start-offset-checkpoint"
    path.write_text(text)
    with pytest.raises(CorruptCheckpointError) as info:
        read_checkpoint(path)
    assert str(path) in str(info.value) and where in str(info.value)
