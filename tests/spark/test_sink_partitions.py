"""The sink's whole-column key partitioning gives exactly the client's (Java's) partition for every key."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from oncelog.client.partitioner import partition_for_key
from oncelog.spark.key_partitions import partitions_for_keys


@pytest.mark.parametrize("partitions", [1, 2, 3, 12, 1000])
def test_matches_the_client_partitioner_for_every_key_length(partitions):
    rng = random.Random(partitions)
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(3000)]
    keys += [b"", b"a", b"ab", b"abc", b"abcd", b"k1234567", "ключ-ü".encode()]
    got = partitions_for_keys(pa.array(keys, pa.binary()), partitions)
    assert got == [partition_for_key(k, partitions) for k in keys]


def test_string_keys_sliced_arrays_and_nulls():
    keys = pa.array([f"user-{i}" for i in range(100)], pa.string())
    assert partitions_for_keys(keys, 7) == [partition_for_key(f"user-{i}".encode(), 7) for i in range(100)]
    sliced = pa.array([f"k{i}".encode() for i in range(50)], pa.binary()).slice(13, 20)
    assert partitions_for_keys(sliced, 5) == [partition_for_key(f"k{i}".encode(), 5) for i in range(13, 33)]
    assert partitions_for_keys(pa.array([b"a", None], pa.binary()), 3) is None
    assert partitions_for_keys(pa.array([], pa.binary()), 3) == []
